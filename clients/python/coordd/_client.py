"""The blocking client."""

from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

import grpc

from coordd import _common as c
from coordd.v1 import coordd_pb2, coordd_pb2_grpc


class Client:
    """A client of coordd's CoordinatorService over one gRPC channel.

    target is "host:port" (resolved through DNS, calls spread round robin
    over every address) or any gRPC target. token, when coordd has tenants,
    is sent as "authorization: Bearer <token>". tls is None (plaintext),
    True (TLS, system roots) or grpc.ChannelCredentials (tls_credentials()).

    Thread-safe; close it (or use it as a context manager) when done.
    """

    def __init__(self, target: str, *, token: Optional[str] = None, tls=None,
                 retry: c.RetryPolicy = c.RetryPolicy(), max_body_bytes: int = 0,
                 options=()):
        creds = c.credentials_of(tls)
        t, opts = c.target_of(target), c.channel_options(options)
        self._channel = grpc.secure_channel(t, creds, opts) if creds else grpc.insecure_channel(t, opts)
        self._stub = coordd_pb2_grpc.CoordinatorServiceStub(self._channel)
        self._md = c.metadata_of(token)
        self._retry = retry
        self._throttle = c.Throttle(retry.max_tokens, retry.token_ratio)
        self._max_body = max_body_bytes
        self._sleep: Callable[[float], None] = time.sleep  # tests record the waits

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get(self, url: str, *, key: Optional[str] = None, max_age: Optional[float] = None,
            no_stale: bool = False, headers: c.HeadersArg = None, credential: Optional[str] = None,
            priority: Optional[str] = None, timeout: float = c.DEFAULT_TIMEOUT) -> c.Document:
        """The document at url, an absolute http(s) URL inside one of coordd's
        upstreams. key is a custom cache key; max_age (seconds) the oldest
        copy accepted; timeout bounds the call, retries included. headers
        (a mapping or (name, value) pairs) are request headers for the
        upstream: coordd forwards those the upstream lists in its
        forward_headers and drops the rest. credential is the caller's own
        credential for the upstream, the whole value of its credential
        header ("Bearer ..."), for upstreams with caller_credentials.
        priority is "interactive" or "background" (a prefetch, a warm-up
        job: within its tenant, a fetch only background calls wait for takes
        the upstream's slots after every fetch an interactive call waits
        for); None sends none, which coordd takes for "interactive"; any
        other value is an InvalidArgumentError before any call. A 404 is a
        Document; errors are CoorddError subclasses."""
        req = c.get_request(url, key, max_age, no_stale, headers, credential, priority=priority)
        md = self._md + c.trace_metadata()
        return self._do(lambda remaining: self._get_once(req, md, remaining), timeout)

    def invalidate(self, url: Optional[str] = None, key: Optional[str] = None, *,
                   headers: c.HeadersArg = None, credential: Optional[str] = None,
                   timeout: float = c.DEFAULT_TIMEOUT) -> c.Invalidated:
        """Removes the document at url (or under key) from coordd's shared
        cache and every instance's memory: the copy that a get with the same
        headers and credential would be served. Needs an admin tenant where
        coordd has tenants."""
        req = c.invalidate_request(url, key, headers, credential)
        md = self._md + c.trace_metadata()

        def once(remaining: float) -> c.Invalidated:
            resp = self._stub.Invalidate(req, timeout=remaining, metadata=md)
            return c.Invalidated(key=resp.key, existed=resp.existed)

        return self._do(once, timeout)

    def _get_once(self, req: coordd_pb2.GetOrFetchRequest, md, remaining: float) -> c.Document:
        call = self._stub.GetOrFetch(req, timeout=remaining, metadata=md)
        r = c.Reassembly(self._max_body)
        try:
            for m in call:
                r.add(m)
        finally:
            call.cancel()  # a no-op once the stream ended; frees it on an early exit
        return r.document()

    def _open(self, req: coordd_pb2.GetOrFetchRequest, timeout: float) -> c.Opened:
        """Starts a GetOrFetch call and returns once its metadata arrived,
        retrying as get does until then; the body streams from the result.
        timeout bounds the whole call, body included. For coordd.httpx."""
        md = self._md + c.trace_metadata()
        return self._do(lambda remaining: self._open_once(req, md, remaining), timeout)

    def _open_once(self, req: coordd_pb2.GetOrFetchRequest, md, remaining: float) -> c.Opened:
        call = self._stub.GetOrFetch(req, timeout=remaining, metadata=md)
        r = c.Reassembly(self._max_body, keep=False, head=req.head)
        try:
            for m in call:
                r.add(m)
                if r.metadata is not None:
                    break
            else:
                r.finish()  # raises BadStream: no metadata
        except BaseException:
            call.cancel()
            raise
        return c.Opened(r.metadata, r.progress, _chunks(call, r), call.cancel)

    def _do(self, attempt, timeout: float):
        deadline = time.monotonic() + timeout
        n = 0
        while True:
            n += 1
            remaining = deadline - time.monotonic()
            try:
                out = attempt(max(remaining, 0.001))
            except grpc.RpcError as e:
                err = c.error_of(e)
            else:
                self._throttle.success()
                return out
            wait = c.retry_wait(self._retry, self._throttle, err, n, deadline - time.monotonic())
            if wait is None:
                raise err
            self._sleep(wait)


def _chunks(call, r: c.Reassembly) -> Iterator[bytes]:
    """The rest of call's stream as body pieces; a failed call raises its
    CoorddError. Closing the generator cancels the call."""
    try:
        for m in call:
            data = r.add(m)
            if data:
                yield data
        r.finish()
    except grpc.RpcError as e:
        raise c.error_of(e) from None
    finally:
        call.cancel()
