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
    BadStreamError,
    BodyTooLargeError,
    CancelledError,
    CoorddError,
    DeadlineExceededError,
    Document,
    Invalidated,
    InvalidArgumentError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RetryPolicy,
    UnauthenticatedError,
    UnavailableError,
    UnreachableError,
    tls_credentials,
)

# The exceptions' first names, aliases of the same classes (deprecated).
from coordd._common import (
    BadStream,
    BodyTooLarge,
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BadStreamError",
    "BodyTooLargeError",
    "CancelledError",
    "Client",
    "CoorddError",
    "DEFAULT_TIMEOUT",
    "DeadlineExceededError",
    "Document",
    "Invalidated",
    "InvalidArgumentError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RetryPolicy",
    "UnauthenticatedError",
    "UnavailableError",
    "UnreachableError",
    "tls_credentials",
    # deprecated aliases
    "BadStream",
    "BodyTooLarge",
    "Cancelled",
    "DeadlineExceeded",
    "InvalidArgument",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
]
