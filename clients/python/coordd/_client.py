"""The blocking client."""

from __future__ import annotations

import time
from typing import Callable, Optional

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
            no_stale: bool = False, timeout: float = c.DEFAULT_TIMEOUT) -> c.Document:
        """The document at url, an absolute http(s) URL inside one of coordd's
        upstreams. key is a custom cache key; max_age (seconds) the oldest
        copy accepted; timeout bounds the call, retries included. A 404 is a
        Document; errors are CoorddError subclasses."""
        req = c.get_request(url, key, max_age, no_stale)
        return self._do(lambda remaining: self._get_once(req, remaining), timeout)

    def invalidate(self, url: Optional[str] = None, key: Optional[str] = None, *,
                   timeout: float = c.DEFAULT_TIMEOUT) -> c.Invalidated:
        """Removes the document at url (or under key) from coordd's shared
        cache and every instance's memory. Needs an admin tenant where coordd
        has tenants."""
        req = c.invalidate_request(url, key)

        def once(remaining: float) -> c.Invalidated:
            resp = self._stub.Invalidate(req, timeout=remaining, metadata=self._md)
            return c.Invalidated(key=resp.key, existed=resp.existed)

        return self._do(once, timeout)

    def _get_once(self, req: coordd_pb2.GetOrFetchRequest, remaining: float) -> c.Document:
        call = self._stub.GetOrFetch(req, timeout=remaining, metadata=self._md)
        r = c.Reassembly(self._max_body)
        try:
            for m in call:
                r.add(m)
        finally:
            call.cancel()  # a no-op once the stream ended; frees it on an early exit
        return r.document()

    def _do(self, attempt, timeout: float):
        deadline = time.monotonic() + timeout
        n = 0
        while True:
            n += 1
            remaining = deadline - time.monotonic()
            try:
                out = attempt(max(remaining, 0.001))
            except grpc.RpcError as e:
                err = c.error_from(e.code(), e.details(), e.trailing_metadata())
            else:
                self._throttle.success()
                return out
            wait = c.retry_wait(self._retry, self._throttle, err, n, deadline - time.monotonic())
            if wait is None:
                raise err
            self._sleep(wait)
