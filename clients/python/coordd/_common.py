"""What the blocking and the asyncio clients share: documents, errors, the
retry policy, the stream's reassembly and the status details."""

from __future__ import annotations

import dataclasses
import datetime
import random
import threading
from typing import Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import grpc

from coordd.v1 import coordd_pb2

try:  # googleapis-common-protos, when installed: never two copies in one descriptor pool
    from google.rpc import error_details_pb2, status_pb2
except ImportError:  # Debian packages no googleapis protos; coordd vendors the two it needs
    from coordd._vendor.google.rpc import error_details_pb2, status_pb2

DEFAULT_TIMEOUT = 30.0
"""Seconds a call may take, its retries included, unless told otherwise."""

MAX_RETRY_DELAY = 60.0
"""Caps the wait a server's RetryInfo can impose, in seconds."""

_ROUND_ROBIN = '{"loadBalancingConfig": [{"round_robin": {}}]}'

_SOURCES = {
    coordd_pb2.SOURCE_L1: "l1",
    coordd_pb2.SOURCE_L2: "l2",
    coordd_pb2.SOURCE_UPSTREAM: "upstream",
}


@dataclasses.dataclass(frozen=True)
class Document:
    """A document reassembled from a GetOrFetch stream.

    An upstream answer that is not 2xx, such as a 404, is a Document with
    that status_code, not an error.
    """

    body: bytes
    """Every chunk, concatenated."""
    status_code: int
    """The upstream's HTTP status."""
    content_type: str
    etag: str
    last_modified: str
    source: str
    """Where it came from: "l1", "l2" or "upstream"."""
    stale: bool
    """Past its fresh lifetime (served stale-while-revalidate or -if-error)."""
    fetched_at: datetime.datetime
    """When coordd fetched it from the upstream (UTC), from the metadata's age."""
    key: str
    """The cache key it is stored under."""
    upstream: str
    """The configured upstream's name."""
    ttl: float
    """Seconds it stays fresh from now; 0 when stale."""
    progress: Tuple[coordd_pb2.Progress, ...] = ()
    """The progress events of the attempt that produced it."""
    headers: Tuple[Tuple[str, str], ...] = ()
    """The upstream's end-to-end response headers (Link, Cache-Control,
    X-RateLimit-*...), in its order; hop-by-hop fields, Set-Cookie and
    Content-Length are not kept."""
    private: bool = False
    """Cached for one credential scope only (a credential was sent upstream:
    the caller's, its tenant's or the upstream's): a cache in front of the
    caller must not share it."""


@dataclasses.dataclass(frozen=True)
class Invalidated:
    """What Invalidate removed."""

    key: str
    existed: bool
    """True when the shared cache (L2) held the document."""


class CoorddError(Exception):
    """A failed call. code is the gRPC status code (None for errors the
    client itself found), retry_delay the wait in seconds coordd asked for
    in a RetryInfo detail (its breaker turns half-open then, or its rate
    limit has a slot), or None."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, retry_delay: Optional[float] = None,
                 reason: Optional[str] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_delay = retry_delay
        self.reason = reason
        """The reason of coordd's google.rpc.ErrorInfo detail (domain
        coordd): OUTSIDE_UPSTREAMS, RATE_LIMITED, BREAKER_OPEN, ... as
        docs/api.md lists them, or None. Act on it, never on message."""

    def __str__(self) -> str:
        name = self.code.name if self.code is not None else type(self).__name__
        return f"{name}: {self.message}"


class InvalidArgumentError(CoorddError):
    """A malformed url or key: fix the call, do not retry it."""


class UnauthenticatedError(CoorddError):
    """No bearer token, or one coordd does not know."""


class PermissionDeniedError(CoorddError):
    """A url outside every upstream, or one the token's tenant is not granted."""


class UnavailableError(CoorddError):
    """The upstream failed with no stale copy, its breaker is open, or coordd
    is unreachable. Retried."""


class UnreachableError(UnavailableError):
    """No coordd answered: the connection was refused, reset or lost, or
    the name did not resolve. gRPC reports these as UNAVAILABLE, as it does
    an UNAVAILABLE that coordd sent (an upstream down, no stale copy); this
    subclass is the former. Retried, as UnavailableError."""


class ResourceExhaustedError(CoorddError):
    """The upstream's rate limit has no slot in time, or coordd is at its cap
    of calls. Retried."""


class BodyTooLargeError(CoorddError):
    """The body is over the upstream's max_body_bytes (FAILED_PRECONDITION),
    or over the client's max_body_bytes. Never retried."""


class DeadlineExceededError(CoorddError):
    """The call's timeout ended."""


class CancelledError(CoorddError):
    """The call was cancelled."""


class BadStreamError(CoorddError):
    """The stream broke coordd's protocol (no metadata, a chunk before it,
    more bytes than it announced)."""

# The classes' first names, which did not end in Error as PEP 8 asks of
# exception names: kept as aliases of the same classes, so that code that
# catches them keeps working. Deprecated; new code uses the ...Error names.
InvalidArgument = InvalidArgumentError
Unauthenticated = UnauthenticatedError
PermissionDenied = PermissionDeniedError
Unavailable = UnavailableError
ResourceExhausted = ResourceExhaustedError
BodyTooLarge = BodyTooLargeError
DeadlineExceeded = DeadlineExceededError
Cancelled = CancelledError
BadStream = BadStreamError



_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: BodyTooLargeError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: CancelledError,
}

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


ERROR_DOMAIN = "coordd"
"""The domain of coordd's google.rpc.ErrorInfo details."""


def details_of(trailing_metadata: Optional[Iterable[Tuple[str, object]]]) -> Tuple[Optional[float], Optional[str]]:
    """The RetryInfo delay (seconds) and coordd's ErrorInfo reason in the
    grpc-status-details-bin trailer, each None when absent."""
    delay: Optional[float] = None
    reason: Optional[str] = None
    for k, v in trailing_metadata or ():
        if k != "grpc-status-details-bin":
            continue
        st = status_pb2.Status()
        try:
            st.ParseFromString(bytes(v))  # type: ignore[arg-type]
        except Exception:  # a trailer that does not decode tells nothing
            return None, None
        for d in st.details:
            if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) and delay is None:
                ri = error_details_pb2.RetryInfo()
                d.Unpack(ri)
                delay = min(ri.retry_delay.seconds + ri.retry_delay.nanos / 1e9, MAX_RETRY_DELAY)
            elif d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR) and reason is None:
                ei = error_details_pb2.ErrorInfo()
                d.Unpack(ei)
                if ei.domain == ERROR_DOMAIN and ei.reason:
                    reason = ei.reason
    return delay, reason


def retry_delay_of(trailing_metadata: Optional[Iterable[Tuple[str, object]]]) -> Optional[float]:
    """The RetryInfo delay in the grpc-status-details-bin trailer, in seconds."""
    return details_of(trailing_metadata)[0]


# gRPC's C core writes this into the debug string of every status that the
# server sent (grpc 1.51 to current); a status it made up itself, for a
# connection that failed, lacks it. Python's gRPC exposes nothing firmer.
_FROM_PEER = "Error received from peer"


def error_from(code: grpc.StatusCode, details: Optional[str], trailing_metadata,
               debug_error_string: Optional[str] = None) -> CoorddError:
    """The typed exception for a failed call. An UNAVAILABLE whose debug
    string (RpcError.debug_error_string()) shows that no server sent it is
    an UnreachableError."""
    cls = _BY_CODE.get(code, CoorddError)
    if code == grpc.StatusCode.UNAVAILABLE and debug_error_string is not None and _FROM_PEER not in debug_error_string:
        cls = UnreachableError
    delay, reason = details_of(trailing_metadata)
    return cls(details or code.name, code, delay, reason)


def error_of(e) -> CoorddError:
    """The typed exception for a grpc.RpcError or grpc.aio.AioRpcError."""
    return error_from(e.code(), e.details(), e.trailing_metadata(), e.debug_error_string())


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a client retries a call that failed with UNAVAILABLE or
    RESOURCE_EXHAUSTED (never another code): after a random wait in
    [0, min(initial_backoff * multiplier**(n-1), max_backoff)) (capped
    exponential backoff with full jitter), or after the RetryInfo delay
    coordd sent if longer, while the call's timeout allows and the client's
    token bucket (gRPC's retry throttling) has more than max_tokens/2.
    As the Go client (clients/go/retry.go)."""

    max_attempts: int = 4
    """Attempts per call, the first included; 1 disables retries."""
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    max_tokens: float = 10.0
    """Size of the retry-throttling bucket shared by the client's calls: each
    retryable failure takes 1, each success puts back token_ratio. Negative:
    never throttled."""
    token_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"coordd: RetryPolicy.max_attempts: {self.max_attempts} is below 1")
        if self.initial_backoff < 0 or self.max_backoff < self.initial_backoff:
            raise ValueError("coordd: RetryPolicy: want 0 <= initial_backoff <= max_backoff")
        if self.multiplier < 1:
            raise ValueError(f"coordd: RetryPolicy.multiplier: {self.multiplier} is below 1")
        if self.token_ratio <= 0:
            raise ValueError("coordd: RetryPolicy.token_ratio: must be positive")

    def backoff(self, n: int) -> float:
        """The wait before retry n (1 for the first retry)."""
        bound = min(self.initial_backoff * self.multiplier ** (n - 1), self.max_backoff)
        return random.uniform(0, bound)


class Throttle:
    """gRPC's retry-throttling token bucket (gRFC A6). Thread-safe."""

    def __init__(self, max_tokens: float, ratio: float):
        self._max, self._ratio = max_tokens, ratio
        self._tokens = max_tokens
        self._lock = threading.Lock()

    def failure(self) -> bool:
        """Takes a token for a failed attempt; True if a retry may follow."""
        if self._max < 0:
            return True
        with self._lock:
            self._tokens = max(self._tokens - 1, 0)
            return self._tokens > self._max / 2

    def success(self) -> None:
        if self._max < 0:
            return
        with self._lock:
            self._tokens = min(self._tokens + self._ratio, self._max)


def retry_wait(policy: RetryPolicy, throttle: Throttle, err: CoorddError, attempt: int, remaining: float) -> Optional[float]:
    """How long to wait before retrying after attempt failed with err, or
    None if the call must fail with err now."""
    if err.code not in RETRYABLE or attempt >= policy.max_attempts or not throttle.failure():
        return None
    wait = max(policy.backoff(attempt), err.retry_delay or 0.0)
    if wait >= remaining:
        return None
    return wait


def target_of(target: str) -> str:
    """target with dns:/// when it names no resolver, so that every address
    a name resolves to gets calls (round robin), as the Go client does."""
    if "://" in target or target.startswith(("unix:", "dns:", "ipv4:", "ipv6:")):
        return target
    return "dns:///" + target


def channel_options(extra: Sequence[Tuple[str, object]] = ()) -> List[Tuple[str, object]]:
    return [("grpc.service_config", _ROUND_ROBIN), *extra]


def credentials_of(tls) -> Optional[grpc.ChannelCredentials]:
    """tls as channel credentials: None or False for plaintext, True for TLS
    with the system's roots, or grpc.ChannelCredentials (see
    tls_credentials)."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    raise TypeError("coordd: tls must be None, True or grpc.ChannelCredentials (see coordd.tls_credentials)")


def tls_credentials(ca_file: Optional[str] = None, cert_file: Optional[str] = None, key_file: Optional[str] = None) -> grpc.ChannelCredentials:
    """TLS credentials for Client(tls=...): the CAs that sign coordd's
    certificate (default: the system's roots) and, for mutual TLS, the
    client's certificate and key, as PEM files."""

    def read(path: Optional[str]) -> Optional[bytes]:
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    if (cert_file is None) != (key_file is None):
        raise ValueError("coordd: tls_credentials: give both cert_file and key_file, or neither")
    return grpc.ssl_channel_credentials(root_certificates=read(ca_file), private_key=read(key_file), certificate_chain=read(cert_file))


def metadata_of(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    if token is None:
        return ()
    return (("authorization", "Bearer " + token),)


_propagator = None  # the W3C propagator; False once opentelemetry-api was found missing


def trace_metadata() -> Tuple[Tuple[str, str], ...]:
    """The caller's W3C trace context (traceparent, and tracestate if any)
    as gRPC metadata, when opentelemetry-api is importable and the calling
    context has an active span; else nothing. OpenTelemetry is optional:
    coordd imports it on the first call, and never requires it.

    It is the W3C propagator, not the globally configured one, because
    coordd's server extracts W3C trace context."""
    global _propagator
    if _propagator is None:
        try:
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _propagator = False
        else:
            _propagator = TraceContextTextMapPropagator()
    if _propagator is False:
        return ()
    carrier: dict = {}
    try:
        _propagator.inject(carrier)
    except Exception:  # tracing must never fail a call
        return ()
    return tuple((k, v) for k, v in carrier.items() if k in ("traceparent", "tracestate") and isinstance(v, str))


HeadersArg = Union[Mapping[str, str], Iterable[Tuple[str, str]], None]


def headers_pb(headers: HeadersArg) -> List[coordd_pb2.Header]:
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [coordd_pb2.Header(name=k, value=v) for k, v in items]


PRIORITIES = {
    None: coordd_pb2.PRIORITY_UNSPECIFIED,
    "interactive": coordd_pb2.PRIORITY_INTERACTIVE,
    "background": coordd_pb2.PRIORITY_BACKGROUND,
}
"""The priorities a call may be given, by name, and their values on the
wire; None sends none, which coordd takes for "interactive"."""


def get_request(url: str, key: Optional[str], max_age: Optional[float], no_stale: bool,
                headers: HeadersArg = None, credential: Optional[str] = None,
                head: bool = False, priority: Optional[str] = None) -> coordd_pb2.GetOrFetchRequest:
    """The request, checked before any network I/O."""
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError("url must be a non-empty string", grpc.StatusCode.INVALID_ARGUMENT)
    req = coordd_pb2.GetOrFetchRequest(url=url, key=key or "", no_stale=no_stale, headers=headers_pb(headers),
                                       credential=credential or "", head=head)
    if priority not in PRIORITIES:
        raise InvalidArgumentError(f"priority {priority!r} must be 'interactive' or 'background'",
                                   grpc.StatusCode.INVALID_ARGUMENT)
    req.priority = PRIORITIES[priority]
    if max_age is not None:
        if max_age < 0:
            raise InvalidArgumentError(f"max_age {max_age} must not be negative", grpc.StatusCode.INVALID_ARGUMENT)
        req.max_age.FromNanoseconds(int(max_age * 1e9))
    return req


class Reassembly:
    """Reassembles one attempt's stream: progress events, one metadata,
    then chunks whose total must be the size the metadata announced (none
    at all for a head request). A metadata announcing more than
    max_body_bytes (if positive) fails with BodyTooLargeError before any chunk.

    With keep=False it keeps no chunk: add returns each chunk's data for
    the caller to pass on, and finish checks the total at the end."""

    def __init__(self, max_body_bytes: int, *, keep: bool = True, head: bool = False):
        self._max = max_body_bytes
        self._keep = keep
        self._head = head
        self._md: Optional[coordd_pb2.Metadata] = None
        self._chunks: List[bytes] = []
        self._have = 0
        self._progress: List[coordd_pb2.Progress] = []

    @property
    def metadata(self) -> Optional[coordd_pb2.Metadata]:
        """The metadata, once it arrived."""
        return self._md

    @property
    def progress(self) -> Tuple[coordd_pb2.Progress, ...]:
        return tuple(self._progress)

    def add(self, m: coordd_pb2.GetOrFetchResponse) -> bytes:
        """Takes the next message; returns a chunk's data, else b""."""
        kind = m.WhichOneof("event")
        if kind == "progress":
            if self._md is not None:
                raise BadStreamError("progress after metadata")
            self._progress.append(m.progress)
        elif kind == "metadata":
            if self._md is not None:
                raise BadStreamError("second metadata")
            size = m.metadata.size
            if size < 0:
                raise BadStreamError(f"metadata says size {size}")
            if self._max > 0 and size > self._max:
                raise BodyTooLargeError(f"metadata says {size} bytes; the limit is {self._max} (max_body_bytes)", grpc.StatusCode.FAILED_PRECONDITION)
            self._md = m.metadata
        elif kind == "chunk":
            if self._md is None:
                raise BadStreamError("chunk before metadata")
            data = m.chunk.data
            if self._head:
                raise BadStreamError("a chunk in the answer to a head request")
            if self._have + len(data) > self._md.size:
                raise BadStreamError(f"body exceeds the {self._md.size} bytes metadata says")
            if self._keep:
                self._chunks.append(data)
            self._have += len(data)
            return data
        return b""

    def finish(self) -> coordd_pb2.Metadata:
        """Checks the stream, which has ended, and returns its metadata."""
        md = self._md
        if md is None:
            raise BadStreamError("stream ended without metadata")
        want = 0 if self._head else md.size
        if self._have != want:
            raise BadStreamError(f"body is {self._have} bytes; metadata says {md.size}")
        return md

    def document(self) -> Document:
        md = self.finish()
        now = datetime.datetime.now(datetime.timezone.utc)
        age = datetime.timedelta(seconds=md.age.seconds, microseconds=md.age.nanos // 1000)
        return Document(
            body=self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks),
            status_code=md.status_code,
            content_type=md.content_type,
            etag=md.etag,
            last_modified=md.last_modified,
            source=_SOURCES.get(md.source, "unspecified"),
            stale=md.stale,
            fetched_at=now - age,
            key=md.key,
            upstream=md.upstream,
            ttl=md.ttl.seconds + md.ttl.nanos / 1e9,
            progress=tuple(self._progress),
            headers=tuple((h.name, h.value) for h in md.headers),
            private=md.private,
        )


def source_name(source: int) -> str:
    """A Source as Document.source spells it: "l1", "l2" or "upstream"."""
    return _SOURCES.get(source, "unspecified")


@dataclasses.dataclass
class Opened:
    """A GetOrFetch call whose metadata has arrived (coordd.httpx's
    transports stream the rest): chunks yields the body's pieces as they
    arrive, checked against metadata.size, and raises a CoorddError if the
    call fails part-way; cancel ends the call early. Not thread-safe."""

    metadata: coordd_pb2.Metadata
    progress: Tuple[coordd_pb2.Progress, ...]
    chunks: object
    """An iterator (Client) or async iterator (AsyncClient) of bytes."""
    cancel: Callable[[], object]


def invalidate_request(url: Optional[str], key: Optional[str], headers: HeadersArg = None,
                       credential: Optional[str] = None) -> coordd_pb2.InvalidateRequest:
    if not url and not key:
        raise InvalidArgumentError("give url or key", grpc.StatusCode.INVALID_ARGUMENT)
    return coordd_pb2.InvalidateRequest(url=url or "", key=key or "", headers=headers_pb(headers), credential=credential or "")
