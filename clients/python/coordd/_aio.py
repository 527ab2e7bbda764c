"""The asyncio client, over grpc.aio."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Awaitable, Callable, Optional

import grpc
import grpc.aio

from coordd import _common as c
from coordd.v1 import coordd_pb2, coordd_pb2_grpc


class AsyncClient:
    """Client for asyncio code (MCP servers are async): the same arguments,
    calls and errors, as coroutines. Create it inside the running event loop
    and close it there (await client.close(), or async with)."""

    def __init__(self, target: str, *, token: Optional[str] = None, tls=None,
                 retry: c.RetryPolicy = c.RetryPolicy(), max_body_bytes: int = 0,
                 options=()):
        creds = c.credentials_of(tls)
        t, opts = c.target_of(target), c.channel_options(options)
        self._channel = grpc.aio.secure_channel(t, creds, opts) if creds else grpc.aio.insecure_channel(t, opts)
        self._stub = coordd_pb2_grpc.CoordinatorServiceStub(self._channel)
        self._md = c.metadata_of(token)
        self._retry = retry
        self._throttle = c.Throttle(retry.max_tokens, retry.token_ratio)
        self._max_body = max_body_bytes
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # tests record the waits

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def get(self, url: str, *, key: Optional[str] = None, max_age: Optional[float] = None,
                  no_stale: bool = False, headers: c.HeadersArg = None, credential: Optional[str] = None,
                  priority: Optional[str] = None, timeout: float = c.DEFAULT_TIMEOUT) -> c.Document:
        """As Client.get."""
        req = c.get_request(url, key, max_age, no_stale, headers, credential, priority=priority)
        md = self._md + c.trace_metadata()
        return await self._do(lambda remaining: self._get_once(req, md, remaining), timeout)

    async def invalidate(self, url: Optional[str] = None, key: Optional[str] = None, *,
                         headers: c.HeadersArg = None, credential: Optional[str] = None,
                         timeout: float = c.DEFAULT_TIMEOUT) -> c.Invalidated:
        """As Client.invalidate."""
        req = c.invalidate_request(url, key, headers, credential)
        md = self._md + c.trace_metadata()

        async def once(remaining: float) -> c.Invalidated:
            resp = await self._stub.Invalidate(req, timeout=remaining, metadata=md)
            return c.Invalidated(key=resp.key, existed=resp.existed)

        return await self._do(once, timeout)

    async def _get_once(self, req: coordd_pb2.GetOrFetchRequest, md, remaining: float) -> c.Document:
        call = self._stub.GetOrFetch(req, timeout=remaining, metadata=md)
        r = c.Reassembly(self._max_body)
        try:
            async for m in call:
                r.add(m)
        finally:
            call.cancel()
        return r.document()

    async def _open(self, req: coordd_pb2.GetOrFetchRequest, timeout: float) -> c.Opened:
        """As Client._open; chunks is an async iterator."""
        md = self._md + c.trace_metadata()
        return await self._do(lambda remaining: self._open_once(req, md, remaining), timeout)

    async def _open_once(self, req: coordd_pb2.GetOrFetchRequest, md, remaining: float) -> c.Opened:
        call = self._stub.GetOrFetch(req, timeout=remaining, metadata=md)
        r = c.Reassembly(self._max_body, keep=False, head=req.head)
        try:
            while r.metadata is None:
                m = await call.read()
                if m is grpc.aio.EOF:
                    r.finish()  # raises BadStream: no metadata
                r.add(m)
        except BaseException:
            call.cancel()
            raise
        return c.Opened(r.metadata, r.progress, _chunks(call, r), call.cancel)

    async def _do(self, attempt, timeout: float):
        deadline = time.monotonic() + timeout
        n = 0
        while True:
            n += 1
            remaining = deadline - time.monotonic()
            try:
                out = await attempt(max(remaining, 0.001))
            except grpc.aio.AioRpcError as e:
                err = c.error_of(e)
            else:
                self._throttle.success()
                return out
            wait = c.retry_wait(self._retry, self._throttle, err, n, deadline - time.monotonic())
            if wait is None:
                raise err
            await self._sleep(wait)


async def _chunks(call, r: c.Reassembly) -> AsyncIterator[bytes]:
    """The rest of call's stream as body pieces; a failed call raises its
    CoorddError. Closing the generator (aclose) cancels the call."""
    try:
        while True:
            m = await call.read()
            if m is grpc.aio.EOF:
                break
            data = r.add(m)
            if data:
                yield data
        r.finish()
    except grpc.aio.AioRpcError as e:
        raise c.error_of(e) from None
    finally:
        call.cancel()
