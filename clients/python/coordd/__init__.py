"""coordd: a client of coordd, which coalesces fetches of documentation
pages so that a cold page costs one upstream request across every caller.

    import coordd

    with coordd.Client("127.0.0.1:50051") as client:
        doc = client.get("https://developer.mozilla.org/en-US/docs/Web/HTTP")
        print(doc.status_code, doc.content_type, len(doc.body))

AsyncClient is the same for asyncio. coordd.httpx (imported on its own,
not by this package) has httpx transports over them. See README.md.
"""

from coordd._aio import AsyncClient
from coordd._client import Client
from coordd._common import (
    DEFAULT_TIMEOUT,
    BadStream,
    BodyTooLarge,
    Cancelled,
    CoorddError,
    DeadlineExceeded,
    Document,
    Invalidated,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    RetryPolicy,
    Unauthenticated,
    Unavailable,
    UnreachableError,
    tls_credentials,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BadStream",
    "BodyTooLarge",
    "Cancelled",
    "Client",
    "CoorddError",
    "DEFAULT_TIMEOUT",
    "DeadlineExceeded",
    "Document",
    "Invalidated",
    "InvalidArgument",
    "PermissionDenied",
    "ResourceExhausted",
    "RetryPolicy",
    "Unauthenticated",
    "Unavailable",
    "UnreachableError",
    "tls_credentials",
]
