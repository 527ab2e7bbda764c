"""httpx transports over coordd: code written for httpx (an API client, an
SDK built on it) fetches through coordd by changing one line.

    import coordd, coordd.httpx, httpx

    http = httpx.Client(transport=coordd.httpx.Transport(coordd.Client("127.0.0.1:50051")))

AsyncTransport(coordd.AsyncClient(...)) is the same for httpx.AsyncClient.
Importing coordd does not import httpx; importing coordd.httpx does.

A GET or HEAD without a body is a GetOrFetch call: the request's headers
go in GetOrFetchRequest.headers (coordd forwards those the upstream lists
in forward_headers and drops the rest) and its Authorization in
GetOrFetchRequest.credential. Its X-Coordd-Priority header (PRIORITY_HEADER:
"interactive" or "background", in any case) is the call's priority and is
sent nowhere, to coordd's headers or the fallback; without one, the
transport's priority applies. Any other value fails the request with
RefusedError. The response answers as the upstream did:
its status (a 404 or a 429 is a response), its headers, its body streamed
as coordd's chunks arrive, coordd's Cache-Control and Age, and coordd's
facts in X-Coordd-Source, X-Coordd-Stale, X-Coordd-Age, X-Coordd-Key and
X-Coordd-Upstream: coordd's one rendering (docs/api.md), as its HTTP door
gives it.

Anything else goes to the fallback transport, if one was given, or fails
with UnsupportedRequestError (an httpx.UnsupportedProtocol) saying why:
another method, a body, a scheme other than http(s), a URL outside every
upstream coordd serves, a credential the upstream does not take from
callers (the last two told by coordd's reason, never its message). coordd
is never bypassed otherwise.

When coordd cannot answer (UNAVAILABLE from coordd: the upstream down with
no stale copy, its breaker open; RESOURCE_EXHAUSTED: its rate limit;
DEADLINE_EXCEEDED) the response is a 503, 429 or 504 with X-Coordd-Error
and coordd's JSON error body, Retry-After on a 503 or 429, as coordd's HTTP
door answers, so that
raise_for_status and retry code behave as they do against the API. When no
coordd answers at all the request fails with httpx.ConnectError, as for a
network error. coordd's other refusals (its token, a malformed request, a
tenant not granted the upstream) fail with RefusedError.
"""

from __future__ import annotations

import json
import math
from typing import AsyncIterator, Iterator, List, Optional, Tuple, Union

import grpc
import httpx

from coordd import _common as c
from coordd._aio import AsyncClient
from coordd._client import Client
from coordd.v1 import coordd_pb2

__all__ = ["AsyncTransport", "PRIORITY_HEADER", "RefusedError", "Transport", "UnsupportedRequestError"]

PRIORITY_HEADER = "X-Coordd-Priority"
"""The request header that sets one request's priority: "interactive" or
"background". coordd's HTTP door reads the same header."""

DEFAULT_RETRY_AFTER = 1
"""Retry-After, in seconds, of a 503 or 429 whose status carried no RetryInfo."""

# The reasons (coordd's ErrorInfo) of a refusal that means coordd does
# not carry the request, as opposed to one it refuses (a tenant not
# granted the upstream): decided by reason, never by message.
_NOT_CARRIED = frozenset({"OUTSIDE_UPSTREAMS", "CALLER_CREDENTIALS_REFUSED"})

# The fields coordd sets on a document's answer, never the upstream's.
_OWNED = frozenset({"content-type", "etag", "last-modified", "cache-control", "age", "content-length",
                    "x-coordd-source", "x-coordd-stale", "x-coordd-age", "x-coordd-key", "x-coordd-upstream",
                    "x-coordd-error"})

# The HTTP status of each gRPC code (docs/api.md, "One rendering").
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 413, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNIMPLEMENTED: 405,
}

# The codes for which coordd itself answered that it cannot answer now.
_UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                          grpc.StatusCode.DEADLINE_EXCEEDED})


class UnsupportedRequestError(httpx.UnsupportedProtocol):
    """A request coordd does not carry: a method other than GET and HEAD, a
    body, a scheme other than http and https, a URL outside every upstream
    coordd serves, or a credential the upstream takes from no caller.
    Raised when the transport has no fallback; its message says why."""


class RefusedError(httpx.TransportError):
    """coordd refused the request for a reason that a fallback must not get
    round: coordd's own token (UNAUTHENTICATED), a malformed URL or header
    (INVALID_ARGUMENT), a tenant not granted the upstream
    (PERMISSION_DENIED), a body over coordd's max_body_bytes
    (FAILED_PRECONDITION). coordd_error is the coordd.CoorddError."""

    def __init__(self, message: str, *, request: httpx.Request, coordd_error: c.CoorddError):
        super().__init__(message, request=request)
        self.coordd_error = coordd_error


class _Options:
    """What Transport and AsyncTransport share."""

    def __init__(self, timeout: float, max_age: Optional[float], no_stale: bool, priority: Optional[str]):
        if timeout <= 0:
            raise ValueError(f"coordd.httpx: timeout {timeout} must be positive")
        if max_age is not None and max_age < 0:
            raise ValueError(f"coordd.httpx: max_age {max_age} must not be negative")
        if priority not in c.PRIORITIES:
            raise ValueError(f"coordd.httpx: priority {priority!r} must be 'interactive' or 'background'")
        self.timeout = timeout
        self.max_age = max_age
        self.no_stale = no_stale
        self.priority = priority


class Transport(httpx.BaseTransport):
    """An httpx transport (httpx.Client(transport=...)) that fetches through
    client, a coordd.Client. See the module's documentation for what is
    carried and how the answers read.

    fallback, an httpx transport such as httpx.HTTPTransport(), takes the
    requests coordd does not carry; without one they fail with
    UnsupportedRequestError. timeout (seconds) bounds each request's call
    to coordd, its retries and its body included (httpx's own timeouts
    time sockets, and this transport has none). max_age and no_stale apply
    to every request, as in Client.get. priority ("interactive" or
    "background", as in Client.get) applies to every request without a
    PRIORITY_HEADER: priority="background" for a transport that only a
    prefetch or warm-up job uses.

    close() closes the fallback, not client, which may serve other code:
    close it yourself. Thread-safe, as client is.
    """

    def __init__(self, client: Client, *, fallback: Optional[httpx.BaseTransport] = None,
                 timeout: float = c.DEFAULT_TIMEOUT, max_age: Optional[float] = None, no_stale: bool = False,
                 priority: Optional[str] = None):
        if not isinstance(client, Client):
            raise TypeError("coordd.httpx.Transport: client must be a coordd.Client (AsyncTransport takes a coordd.AsyncClient)")
        if fallback is not None and not isinstance(fallback, httpx.BaseTransport):
            raise TypeError("coordd.httpx.Transport: fallback must be an httpx.BaseTransport")
        self._client = client
        self._fallback = fallback
        self._opts = _Options(timeout, max_age, no_stale, priority)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        priority = _priority(request, self._opts.priority)
        why = _not_carried(request)
        if why is None:
            try:
                req = _grpc_request(request, self._opts, priority)
                opened = self._client._open(req, self._opts.timeout)
            except c.CoorddError as err:
                outcome = _failed(request, err)
                if isinstance(outcome, httpx.Response):
                    return outcome
                why = outcome
            else:
                return _response(request, opened, _SyncBody(request, opened))
        if self._fallback is not None:
            return self._fallback.handle_request(_without_priority(request))
        raise UnsupportedRequestError(why, request=request)

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()


class AsyncTransport(httpx.AsyncBaseTransport):
    """Transport for httpx.AsyncClient, over a coordd.AsyncClient; fallback
    is an httpx.AsyncBaseTransport (httpx.AsyncHTTPTransport()). Use it in
    the event loop client was created in; aclose() closes the fallback."""

    def __init__(self, client: AsyncClient, *, fallback: Optional[httpx.AsyncBaseTransport] = None,
                 timeout: float = c.DEFAULT_TIMEOUT, max_age: Optional[float] = None, no_stale: bool = False,
                 priority: Optional[str] = None):
        if not isinstance(client, AsyncClient):
            raise TypeError("coordd.httpx.AsyncTransport: client must be a coordd.AsyncClient (Transport takes a coordd.Client)")
        if fallback is not None and not isinstance(fallback, httpx.AsyncBaseTransport):
            raise TypeError("coordd.httpx.AsyncTransport: fallback must be an httpx.AsyncBaseTransport")
        self._client = client
        self._fallback = fallback
        self._opts = _Options(timeout, max_age, no_stale, priority)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        priority = _priority(request, self._opts.priority)
        why = _not_carried(request)
        if why is None:
            try:
                req = _grpc_request(request, self._opts, priority)
                opened = await self._client._open(req, self._opts.timeout)
            except c.CoorddError as err:
                outcome = _failed(request, err)
                if isinstance(outcome, httpx.Response):
                    return outcome
                why = outcome
            else:
                return _response(request, opened, _AsyncBody(request, opened))
        if self._fallback is not None:
            return await self._fallback.handle_async_request(_without_priority(request))
        raise UnsupportedRequestError(why, request=request)

    async def aclose(self) -> None:
        if self._fallback is not None:
            await self._fallback.aclose()


class _SyncBody(httpx.SyncByteStream):
    """The body as coordd's chunks arrive; close() cancels the call."""

    def __init__(self, request: httpx.Request, opened: c.Opened):
        self._request = request
        self._opened = opened

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._opened.chunks  # type: ignore[misc]
        except c.CoorddError as err:
            raise _body_error(self._request, err) from err

    def close(self) -> None:
        self._opened.chunks.close()  # type: ignore[attr-defined]
        self._opened.cancel()  # a generator never started runs no finally


class _AsyncBody(httpx.AsyncByteStream):
    """As _SyncBody, for asyncio."""

    def __init__(self, request: httpx.Request, opened: c.Opened):
        self._request = request
        self._opened = opened

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._opened.chunks:  # type: ignore[attr-defined]
                yield data
        except c.CoorddError as err:
            raise _body_error(self._request, err) from err

    async def aclose(self) -> None:
        await self._opened.chunks.aclose()  # type: ignore[attr-defined]
        self._opened.cancel()


def _not_carried(request: httpx.Request) -> Optional[str]:
    """Why coordd cannot carry request, or None if it can."""
    what = f"{request.method} {_redacted(request.url)}"
    if request.method not in ("GET", "HEAD"):
        return f"coordd carries GET and HEAD only, not {what}"
    if request.url.scheme not in ("http", "https"):
        return f"coordd carries http and https URLs only, not {what}"
    h = request.headers
    if "transfer-encoding" in h or h.get("content-length", "0").strip() != "0":
        return f"coordd carries requests without a body only, not {what} with one"
    return None


def _redacted(url: httpx.URL) -> str:
    """url without its userinfo and fragment, for messages."""
    return str(url.copy_with(username=None, password=None, fragment=None))


def _priority(request: httpx.Request, default: Optional[str]) -> Optional[str]:
    """The priority request asks for with PRIORITY_HEADER, or default.
    A value that is neither "interactive" nor "background" (in any case),
    or more than one field, raises RefusedError."""
    values = request.headers.get_list(PRIORITY_HEADER)
    if not values:
        return default
    p = values[0].strip().lower() if len(values) == 1 else None
    if p not in ("interactive", "background"):
        err = c.InvalidArgumentError(f"{PRIORITY_HEADER} {', '.join(values)[:64]!r} must be 'interactive' or 'background'",
                                     grpc.StatusCode.INVALID_ARGUMENT)
        raise RefusedError(f"coordd.httpx: {request.method} {_redacted(request.url)}: {err}",
                           request=request, coordd_error=err)
    return p


def _without_priority(request: httpx.Request) -> httpx.Request:
    """request without PRIORITY_HEADER, for the fallback: a copy if it has
    one, so that the caller's request is left as it was."""
    if PRIORITY_HEADER not in request.headers:
        return request
    headers = request.headers.copy()
    del headers[PRIORITY_HEADER]
    return httpx.Request(request.method, request.url, headers=headers, stream=request.stream,
                         extensions=request.extensions)


def _grpc_request(request: httpx.Request, opts: _Options, priority: Optional[str]) -> coordd_pb2.GetOrFetchRequest:
    """The GetOrFetch call for request: every header but Authorization,
    which is the credential, and PRIORITY_HEADER, which is the priority."""
    headers: List[Tuple[str, str]] = []
    for name, value in request.headers.multi_items():
        if name.lower() not in ("authorization", "x-coordd-priority"):
            headers.append((name, value))
    return c.get_request(_redacted(request.url), None, opts.max_age, opts.no_stale, headers,
                         request.headers.get("authorization"), head=request.method == "HEAD", priority=priority)


def _failed(request: httpx.Request, err: c.CoorddError) -> Union[httpx.Response, str]:
    """What a call that failed before its metadata gives: a response (coordd
    cannot answer now), a reason why coordd does not carry the request (for
    the fallback), or an exception raised here."""
    if isinstance(err, c.UnreachableError):
        raise httpx.ConnectError(f"coordd unreachable: {err.message}", request=request) from err
    if err.code in _UNAVAILABLE:
        return _error_response(request, err)
    if err.reason in _NOT_CARRIED:
        return f"coordd does not carry {request.method} {_redacted(request.url)}: {err}"
    raise RefusedError(f"coordd refused {request.method} {_redacted(request.url)}: {err}",
                       request=request, coordd_error=err) from err


def _render_error(err: c.CoorddError) -> Tuple[int, List[Tuple[bytes, bytes]], bytes]:
    """coordd's one rendering of an error (docs/api.md, "One rendering"):
    its status, header fields and JSON body. A 429 or 503 has Retry-After,
    the RetryInfo's delay in whole seconds, rounded up (DEFAULT_RETRY_AFTER
    without one)."""
    status = _HTTP_STATUS.get(err.code, 500) if err.code is not None else 503
    name = err.code.name if err.code is not None else "UNAVAILABLE"
    detail: dict = {"code": status, "status": name}
    if err.reason:
        detail["reason"] = err.reason
    detail["message"] = err.message
    headers: List[Tuple[bytes, bytes]] = []
    if status in (429, 503):
        retry_after = max(math.ceil(err.retry_delay), 1) if err.retry_delay else DEFAULT_RETRY_AFTER
        detail["retry_after_seconds"] = retry_after
        headers.append((b"Retry-After", str(retry_after).encode()))
    if err.code == grpc.StatusCode.UNAUTHENTICATED:
        headers.append((b"WWW-Authenticate", b'Bearer realm="coordd"'))
    body = json.dumps({"message": f"coordd: {name}: {err.message}", "error": detail}).encode() + b"\n"
    headers += [
        (b"Content-Type", b"application/json"),
        (b"Content-Length", str(len(body)).encode()),
        (b"X-Coordd-Error", _header_value(f"{name}: {err.message}")),
    ]
    return status, headers, body


def _error_response(request: httpx.Request, err: c.CoorddError) -> httpx.Response:
    """The answer to a call coordd could not answer now."""
    status, headers, body = _render_error(err)
    return httpx.Response(status, headers=headers, content=body, request=request)


def _render_document(md) -> Tuple[int, List[Tuple[bytes, bytes]]]:
    """coordd's one rendering of a document: its status (502 for one
    outside 200-599) and header fields, the upstream's but those coordd
    sets, then coordd's."""
    age = str(max(md.age.seconds, 0)).encode()  # whole seconds, rounded down, as HTTP's Age
    headers: List[Tuple[bytes, bytes]] = []
    for h in md.headers:
        name = h.name.lower()
        # The upstream's Cache-Control only from a coordd that renders none.
        if name not in _OWNED or (name == "cache-control" and not md.cache_control):
            headers.append((h.name.encode("latin-1", "replace"), _header_value(h.value)))
    for name, value in ((b"Content-Type", md.content_type), (b"ETag", md.etag),
                        (b"Last-Modified", md.last_modified), (b"Cache-Control", md.cache_control)):
        if value:
            headers.append((name, _header_value(value)))
    headers += [(b"Content-Length", str(md.size).encode()), (b"Age", age), (b"X-Coordd-Age", age)]
    source = c.source_name(md.source) if md.source else ""
    if source:
        headers.append((b"X-Coordd-Source", source.encode()))
    headers.append((b"X-Coordd-Stale", b"true" if md.stale else b"false"))
    if md.key:
        headers.append((b"X-Coordd-Key", _header_value(md.key)))
    if md.upstream:
        headers.append((b"X-Coordd-Upstream", _header_value(md.upstream)))
    status = md.status_code if 200 <= md.status_code <= 599 else 502
    return status, headers


def _response(request: httpx.Request, opened: c.Opened, stream) -> httpx.Response:
    """The upstream's answer as coordd renders it (_render_document)."""
    status, headers = _render_document(opened.metadata)
    return httpx.Response(status, headers=headers, stream=stream, request=request,
                          extensions={"coordd_metadata": opened.metadata})


def _header_value(s: str) -> bytes:
    """s as a header value: UTF-8, with control characters (CR, LF...) as
    spaces."""
    return "".join(" " if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in s).encode("utf-8")


def _body_error(request: httpx.Request, err: c.CoorddError) -> httpx.TransportError:
    """The httpx error for a call that failed part-way through the body,
    as a connection that fails mid-response reads in httpx."""
    if err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return httpx.ReadTimeout(f"coordd: the call's timeout ended mid-body: {err}", request=request)
    if isinstance(err, c.BadStream):
        return httpx.RemoteProtocolError(f"coordd: {err}", request=request)
    return httpx.ReadError(f"coordd: the call failed mid-body: {err}", request=request)
