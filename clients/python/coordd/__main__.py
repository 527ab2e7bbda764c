"""python3 -m coordd get --target HOST:PORT URL: the document's body on
standard output, for shell scripts and checks.

Exit status: 0 for a 2xx document; 3 for another status (404, ...), whose
body is still written; 1 when coordd refuses or fails the call (the reason
on standard error); 2 for bad usage. The token comes from --token or
$COORDD_TOKEN.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from coordd import _common as c
from coordd._client import Client


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m coordd", description="Get documents through coordd.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--target", required=True, help="coordd's HOST:PORT (or a gRPC target)")
        sp.add_argument("--token", default=os.environ.get("COORDD_TOKEN"), help="bearer token (default: $COORDD_TOKEN)")
        sp.add_argument("--tls", action="store_true", help="TLS with the system's roots")
        sp.add_argument("--tls-ca", metavar="FILE", help="TLS, trusting the CAs in FILE (PEM)")
        sp.add_argument("--tls-cert", metavar="FILE", help="client certificate for mutual TLS (PEM)")
        sp.add_argument("--tls-key", metavar="FILE", help="client key for mutual TLS (PEM)")
        sp.add_argument("--timeout", type=float, default=c.DEFAULT_TIMEOUT, help="seconds, retries included (default %(default)s)")

    g = sub.add_parser("get", help="write a document's body to standard output")
    common(g)
    g.add_argument("--key", help="custom cache key")
    g.add_argument("--max-age", type=float, help="oldest copy accepted, in seconds")
    g.add_argument("--no-stale", action="store_true", help="refuse stale copies")
    g.add_argument("-i", "--include", action="store_true", help="print the metadata to standard error")
    g.add_argument("url")
    inv = sub.add_parser("invalidate", help="remove a document from coordd's caches")
    common(inv)
    inv.add_argument("--key", help="cache key")
    inv.add_argument("url", nargs="?")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    tls = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        tls = c.tls_credentials(args.tls_ca, args.tls_cert, args.tls_key)
    elif args.tls:
        tls = True
    try:
        with Client(args.target, token=args.token, tls=tls) as client:
            if args.command == "invalidate":
                r = client.invalidate(args.url, args.key, timeout=args.timeout)
                print(f"key {r.key} existed {str(r.existed).lower()}")
                return 0
            doc = client.get(args.url, key=args.key, max_age=args.max_age, no_stale=args.no_stale, timeout=args.timeout)
    except c.CoorddError as e:
        print(f"coordd: {e}", file=sys.stderr)
        return 1
    if args.include:
        print(f"status {doc.status_code} source {doc.source} stale {str(doc.stale).lower()} "
              f"content-type {doc.content_type!r} etag {doc.etag!r} size {len(doc.body)}", file=sys.stderr)
    sys.stdout.buffer.write(doc.body)
    sys.stdout.flush()
    if not 200 <= doc.status_code < 300:
        print(f"coordd: the upstream answered {doc.status_code}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
