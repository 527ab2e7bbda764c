"""Tests of coordd.httpx: code written for httpx, unmodified but for its
transport, fetches through real coordd instances from a fake GitHub-like
API (internal/testing/fakeapi).

Debian ships no API client library that takes an httpx client or transport
(apt-cache rdepends python3-httpx: dnspython's DNS-over-HTTPS, duckpy,
which POSTs to a search page on a client of its own, cobra, which calls
module-level httpx functions, and two programs). So the code under test is
httpx's own high-level Client, driven as a GitHub client drives it (the
GitHub and AsyncGitHub classes below): base_url, the API's headers, event
hooks, pagination through Link with Response.links.

clients/python/python_test.go starts everything and runs these tests; the
environment tells where (besides test_client.py's):

  COORDD_API_URL          the fake API's base URL; GET /_fake/stats counts
                          its requests by path and login
  COORDD_API_TARGETS      three coordd instances sharing one Redis, comma-
                          separated, in front of it as upstream "gh" (which
                          holds login bot's credential, forwards Accept and
                          takes callers' own credentials), and of
                          COORDD_DOWN_URL as upstream "down" (nothing
                          listens there; its breaker opens on one failure)
  COORDD_API_TOKENS       login=token,...: the callers' own API tokens
"""

import asyncio
import functools
import hashlib
import os
import socket
import subprocess
import sys
import threading
import unittest

try:
    import httpx
except ImportError as e:  # a missing httpx fails the run: no test is skipped
    raise ImportError("coordd.httpx's tests need httpx: apt-get install python3-httpx (Debian), "
                      "or run 'make deps'") from e

import coordd
import coordd.httpx

API = os.environ["COORDD_API_URL"]
API_TARGETS = os.environ["COORDD_API_TARGETS"].split(",")
TOKENS = dict(kv.split("=", 1) for kv in os.environ["COORDD_API_TOKENS"].split(","))
DOWN = os.environ["COORDD_DOWN_URL"]
TARGET = os.environ["COORDD_TARGET"]
UPSTREAM = os.environ["COORDD_UPSTREAM"]
BIG_SHA256 = os.environ["COORDD_BIG_SHA256"]

PER_INSTANCE = 30
CHUNK_SIZE = 64 << 10  # server.ChunkSize


def github_headers(token):
    h = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
         "User-Agent": "octo-script/1.0"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


class GitHub:
    """A small GitHub REST client, as people write them on httpx. Nothing in
    it knows coordd: only the transport it is given does."""

    def __init__(self, token=None, *, transport=None, raise_errors=True):
        self.sent = []
        hooks = {"request": [self.sent.append], "response": [self._check] if raise_errors else []}
        self.http = httpx.Client(base_url=API, headers=github_headers(token), transport=transport,
                                 event_hooks=hooks, timeout=30)

    @staticmethod
    def _check(response):
        response.raise_for_status()

    def get(self, path, **params):
        return self.http.get(path, params=params or None).json()

    def paginate(self, path, per_page=30):
        """Every item of a list endpoint, following rel="next"."""
        r = self.http.get(path, params={"per_page": per_page})
        while True:
            yield from r.json()
            nxt = r.links.get("next")
            if nxt is None:
                return
            r = self.http.get(nxt["url"])

    def close(self):
        self.http.close()


class AsyncGitHub:
    """GitHub for asyncio."""

    def __init__(self, token=None, *, transport=None, raise_errors=True):
        self.sent = []

        async def record(request):
            self.sent.append(request)

        async def check(response):
            response.raise_for_status()

        hooks = {"request": [record], "response": [check] if raise_errors else []}
        self.http = httpx.AsyncClient(base_url=API, headers=github_headers(token), transport=transport,
                                      event_hooks=hooks, timeout=30)

    async def get(self, path, **params):
        return (await self.http.get(path, params=params or None)).json()

    async def paginate(self, path, per_page=30):
        out = []
        r = await self.http.get(path, params={"per_page": per_page})
        while True:
            out += r.json()
            nxt = r.links.get("next")
            if nxt is None:
                return out
            r = await self.http.get(nxt["url"])

    async def aclose(self):
        await self.http.aclose()


def upstream_requests(prefix):
    """The fake API's requests for paths starting with prefix, by login
    (GET /_fake/stats, not counted; straight to the API, not through any
    proxy of the environment)."""
    with httpx.Client(trust_env=False) as direct:
        stats = direct.get(API + "/_fake/stats").json()
    out = {}
    for h in stats["hits"]:
        if h["path"].startswith(prefix):
            out[h["login"]] = out.get(h["login"], 0) + h["count"]
    return out


def upstream_pages(prefix):
    """As upstream_requests, by path with its query."""
    with httpx.Client(trust_env=False) as direct:
        stats = direct.get(API + "/_fake/stats").json()
    return {h["path"]: h["count"] for h in stats["hits"] if h["path"].startswith(prefix)}


def closed_port():
    """A loopback address where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


class Checks:
    """Assertions both transports' tests make."""

    def assert_coordd_headers(self, r):
        self.assertIn(r.headers["x-coordd-source"], ("l1", "l2", "upstream"))
        self.assertIn(r.headers["x-coordd-stale"], ("true", "false"))
        self.assertTrue(r.headers["x-coordd-age"].isdigit())
        self.assertTrue(r.headers["age"].isdigit())
        self.assertEqual(r.headers["x-coordd-upstream"], "gh")

    def assert_unavailable(self, r):
        self.assertEqual(r.status_code, 503)
        self.assertTrue(r.headers["retry-after"].isdigit(), r.headers)
        self.assertGreaterEqual(int(r.headers["retry-after"]), 1)
        self.assertTrue(r.headers["x-coordd-error"].startswith("UNAVAILABLE: "), r.headers["x-coordd-error"])
        self.assertEqual(r.json()["error"]["status"], "UNAVAILABLE")
        with self.assertRaises(httpx.HTTPStatusError):
            r.raise_for_status()


class TransportTest(unittest.TestCase, Checks):
    def setUp(self):
        self.coordd = [coordd.Client(t) for t in API_TARGETS]
        for cl in self.coordd:
            self.addCleanup(cl.close)

    def github(self, i, token=None, **kwargs):
        gh = GitHub(token, transport=coordd.httpx.Transport(self.coordd[i]), **kwargs)
        self.addCleanup(gh.close)
        return gh

    def test_concurrent_calls_make_one_upstream_request_per_credential(self):
        # Threads on 3 instances: 30 each as alice (her own token), as bob
        # (his), and without a token (coordd sends bot's), all at once.
        path = "/repos/octo/threads/readme"
        who = {"alice": TOKENS["alice"], "bob": TOKENS["bob"], "bot": None}
        clients = {(login, i): self.github(i, token) for login, token in who.items() for i in range(3)}
        start = threading.Barrier(len(clients) * PER_INSTANCE)
        got, errors = [], []

        def call(login, gh):
            try:
                start.wait()
                got.append((login, gh.get(path)["viewer"]))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=call, args=(login, gh))
                   for (login, _), gh in clients.items() for _ in range(PER_INSTANCE)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(got), len(threads))
        for login, viewer in got:
            self.assertEqual(viewer, login, "a caller got another credential's answer")
        self.assertEqual(upstream_requests(path), {"alice": 1, "bob": 1, "bot": 1})

    def test_pagination_follows_link(self):
        path = "/repos/octo/paged/issues"
        for i in range(3):
            gh = self.github(i, TOKENS["alice"])
            issues = list(gh.paginate(path))
            self.assertEqual([x["number"] for x in issues], list(range(1, 76)))
            self.assertEqual({x["viewer"] for x in issues}, {"alice"})
            self.assertEqual(len(gh.sent), 3, [str(r.url) for r in gh.sent])
        # Each page once, for all three instances.
        pages = upstream_pages(path)
        self.assertEqual(len(pages), 3, pages)
        self.assertEqual(set(pages.values()), {1}, pages)
        r = self.github(0, TOKENS["alice"]).http.get(path, params={"per_page": 30})
        self.assertIn('rel="next"', r.headers["link"])
        # coordd's Cache-Control, not the API's s-maxage: one credential's
        # copy, fresh for the 60 s coordd serves it (docs/api.md, one rendering).
        self.assertEqual(r.headers["cache-control"], "private, max-age=60")
        self.assertEqual(r.headers["cache-control"], r.extensions["coordd_metadata"].cache_control)
        self.assertEqual(r.headers["x-ratelimit-resource"], "core")
        self.assertTrue(r.headers["x-ratelimit-remaining"].isdigit())
        self.assertNotIn("set-cookie", r.headers)
        self.assertEqual(r.headers["content-length"], str(len(r.content)))
        self.assertEqual(r.headers["content-type"], "application/json; charset=utf-8")
        self.assertTrue(r.headers["etag"])
        self.assert_coordd_headers(r)
        self.assertIsNotNone(r.extensions.get("coordd_metadata"))
        self.assertTrue(r.extensions["coordd_metadata"].private)

    def test_404_is_a_response(self):
        gh = self.github(0, TOKENS["bob"])
        with self.assertRaises(httpx.HTTPStatusError) as cm:
            gh.get("/repos/octo/r/pulls")
        self.assertEqual(cm.exception.response.status_code, 404)
        plain = self.github(1, TOKENS["bob"], raise_errors=False)
        r = plain.http.get("/repos/octo/r/pulls")
        self.assertEqual(r.status_code, 404)
        self.assertEqual(r.json(), {"message": "Not Found"})

    def test_upstream_down_is_503(self):
        # One attempt per call, so that the second finds the breaker that
        # the first opened, and its RetryInfo.
        with coordd.Client(API_TARGETS[0], retry=coordd.RetryPolicy(max_attempts=1)) as once:
            http = httpx.Client(transport=coordd.httpx.Transport(once))
            self.addCleanup(http.close)
            first = http.get(DOWN + "/sync/x")
            self.assert_unavailable(first)
            second = http.get(DOWN + "/sync/y")
            self.assert_unavailable(second)
            # The open breaker's RetryInfo, up to a minute, in whole seconds rounded up.
            self.assertGreaterEqual(int(second.headers["retry-after"]), 2)
            self.assertLessEqual(int(second.headers["retry-after"]), 60)
            # coordd answered: an Unavailable, not an UnreachableError.
            with self.assertRaises(coordd.Unavailable) as cm:
                once.get(DOWN + "/sync/z")
            self.assertNotIsInstance(cm.exception, coordd.UnreachableError)

    def test_not_carried_fails_or_falls_back(self):
        cases = {
            "POST": ("POST", API + "/repos/octo/r/issues", {"json": {"title": "x"}}, "GET and HEAD only"),
            "a body": ("GET", API + "/repos/octo/r/issues", {"content": b"x"}, "without a body"),
            "outside every upstream": ("GET", "http://127.0.0.1:9/elsewhere", {}, "outside every configured upstream"),
            "a credential the upstream takes from no caller": (
                "GET", DOWN + "/private", {"headers": {"Authorization": "Bearer " + TOKENS["alice"]}},
                "does not accept caller credentials"),
        }
        before = upstream_requests("/repos/octo/r/issues")
        for name, (method, url, kwargs, why) in cases.items():
            with self.subTest(name):
                http = httpx.Client(transport=coordd.httpx.Transport(self.coordd[0]))
                self.addCleanup(http.close)
                with self.assertRaises(coordd.httpx.UnsupportedRequestError) as cm:
                    http.request(method, url, **kwargs)
                self.assertIsInstance(cm.exception, httpx.UnsupportedProtocol)
                self.assertIsInstance(cm.exception, httpx.RequestError)
                self.assertIn(why, str(cm.exception))
                seen = []

                def fallback(request):
                    seen.append((request.method, str(request.url), request.read()))
                    return httpx.Response(201, json={"fallback": True})

                http = httpx.Client(transport=coordd.httpx.Transport(self.coordd[0], fallback=httpx.MockTransport(fallback)))
                self.addCleanup(http.close)
                r = http.request(method, url, **kwargs)
                self.assertEqual(r.status_code, 201)
                self.assertEqual(r.json(), {"fallback": True})
                self.assertEqual(len(seen), 1)
                self.assertEqual(seen[0][:2], (method, url))
        self.assertEqual(upstream_requests("/repos/octo/r/issues"), before)

    def test_refused(self):
        http = httpx.Client(transport=coordd.httpx.Transport(self.coordd[0], fallback=httpx.MockTransport(
            lambda request: self.fail("a refusal went to the fallback"))))
        self.addCleanup(http.close)
        with self.assertRaises(coordd.httpx.RefusedError) as cm:
            http.get(API + "/repos/octo/r/readme", headers={"Accept": "x" * 2000})
        self.assertIsInstance(cm.exception, httpx.TransportError)
        self.assertIsInstance(cm.exception.coordd_error, coordd.InvalidArgument)
        self.assertIn("INVALID_ARGUMENT", str(cm.exception))

    def test_head_has_headers_and_no_body(self):
        path = "/repos/octo/head/readme"
        gh = self.github(0, TOKENS["alice"])
        h = gh.http.head(path)
        self.assertEqual(h.status_code, 200)
        self.assertEqual(h.content, b"")
        self.assertEqual(h.headers["content-type"], "application/json; charset=utf-8")
        self.assertTrue(h.headers["etag"])
        self.assert_coordd_headers(h)
        g = self.github(1, TOKENS["alice"]).http.get(path)
        self.assertEqual(h.headers["content-length"], str(len(g.content)))
        self.assertEqual(h.headers["etag"], g.headers["etag"])
        self.assertEqual(g.json()["viewer"], "alice")
        self.assertEqual(upstream_requests(path), {"alice": 1}, "HEAD fetches (as a GET) and caches")

    def test_coordd_unreachable_is_a_connect_error(self):
        with coordd.Client(closed_port(), retry=coordd.RetryPolicy(max_attempts=1)) as gone:
            http = httpx.Client(transport=coordd.httpx.Transport(gone))
            self.addCleanup(http.close)
            with self.assertRaises(httpx.ConnectError) as cm:
                http.get(API + "/repos/octo/r/readme")
            self.assertIn("coordd unreachable", str(cm.exception))
            with self.assertRaises(coordd.UnreachableError):
                gone.get(API + "/repos/octo/r/readme")

    def test_body_streams_as_the_chunks_arrive(self):
        with coordd.Client(TARGET) as docs:
            http = httpx.Client(transport=coordd.httpx.Transport(docs))
            self.addCleanup(http.close)
            with http.stream("GET", UPSTREAM + "/docs/big") as r:
                self.assertEqual(r.headers["content-length"], "300000")
                self.assertFalse(r.is_stream_consumed)
                pieces = list(r.iter_raw())
            # One piece per chunk message, passed on as it came: not one
            # buffered body.
            self.assertEqual([len(p) for p in pieces[:-1]], [CHUNK_SIZE] * (len(pieces) - 1))
            self.assertEqual(len(pieces), -(-300000 // CHUNK_SIZE))
            self.assertEqual(hashlib.sha256(b"".join(pieces)).hexdigest(), BIG_SHA256)
            # Closing early cancels the call; the next one is served.
            with http.stream("GET", UPSTREAM + "/docs/big") as r:
                next(r.iter_raw())
            self.assertEqual(len(http.get(UPSTREAM + "/docs/big").content), 300000)

    def test_importing_coordd_does_not_import_httpx(self):
        p = subprocess.run([sys.executable, "-c", "import sys, coordd; print('httpx' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "False")


def in_loop(test):
    """Runs the coroutine test method in the class's event loop, with
    self.coordd, an AsyncClient per instance, closed after it."""

    @functools.wraps(test)
    def run(self):
        async def body():
            self.coordd = [coordd.AsyncClient(t) for t in API_TARGETS]
            self.open = []
            try:
                await test(self)
            finally:
                for gh in self.open:
                    await gh.aclose()
                for cl in self.coordd:
                    await cl.close()

        self.loop.run_until_complete(body())

    return run


class AsyncTransportTest(unittest.TestCase, Checks):
    # One event loop for every test: grpc.aio does not survive a loop
    # closed under it (as in test_conformance.py).
    @classmethod
    def setUpClass(cls):
        cls.loop = asyncio.new_event_loop()

    @classmethod
    def tearDownClass(cls):
        cls.loop.close()

    def github(self, i, token=None, **kwargs):
        gh = AsyncGitHub(token, transport=coordd.httpx.AsyncTransport(self.coordd[i]), **kwargs)
        self.open.append(gh)
        return gh

    @in_loop
    async def test_gathered_calls_make_one_upstream_request_per_credential(self):
        path = "/repos/octo/gathered/readme"
        who = {"alice": TOKENS["alice"], "bob": TOKENS["bob"], "bot": None}
        calls, logins = [], []
        for login, token in who.items():
            for i in range(3):
                gh = self.github(i, token)
                for _ in range(PER_INSTANCE):
                    calls.append(gh.get(path))
                    logins.append(login)
        answers = await asyncio.gather(*calls)
        for login, answer in zip(logins, answers):
            self.assertEqual(answer["viewer"], login, "a caller got another credential's answer")
        self.assertEqual(upstream_requests(path), {"alice": 1, "bob": 1, "bot": 1})

    @in_loop
    async def test_pagination_follows_link(self):
        path = "/repos/octo/apaged/issues"
        results = await asyncio.gather(*(self.github(i, TOKENS["bob"]).paginate(path, per_page=20) for i in range(3)))
        for issues in results:
            self.assertEqual([x["number"] for x in issues], list(range(1, 76)))
            self.assertEqual({x["viewer"] for x in issues}, {"bob"})
        pages = upstream_pages(path)
        self.assertEqual(len(pages), 4, pages)
        self.assertEqual(set(pages.values()), {1}, pages)

    @in_loop
    async def test_404_503_head(self):
        gh = self.github(0, TOKENS["bob"])
        with self.assertRaises(httpx.HTTPStatusError) as cm:
            await gh.get("/repos/octo/r/tags")
        self.assertEqual(cm.exception.response.status_code, 404)
        plain = self.github(1, raise_errors=False)
        self.assert_unavailable(await plain.http.get(DOWN + "/async/x"))
        h = await plain.http.head("/repos/octo/ahead/readme")
        self.assertEqual((h.status_code, h.content), (200, b""))
        self.assert_coordd_headers(h)
        g = await plain.http.get("/repos/octo/ahead/readme")
        self.assertEqual(h.headers["content-length"], str(len(g.content)))
        self.assertEqual(g.json()["viewer"], "bot")

    @in_loop
    async def test_not_carried_fails_or_falls_back(self):
        http = httpx.AsyncClient(transport=coordd.httpx.AsyncTransport(self.coordd[0]))
        with self.assertRaises(coordd.httpx.UnsupportedRequestError) as cm:
            await http.post(API + "/repos/octo/r/issues", json={"title": "x"})
        self.assertIn("GET and HEAD only", str(cm.exception))
        with self.assertRaises(coordd.httpx.UnsupportedRequestError) as cm:
            await http.get("http://127.0.0.1:9/elsewhere")
        self.assertIn("outside every configured upstream", str(cm.exception))
        await http.aclose()

        async def fallback(request):
            return httpx.Response(201, json={"method": request.method})

        http = httpx.AsyncClient(transport=coordd.httpx.AsyncTransport(self.coordd[0], fallback=httpx.MockTransport(fallback)))
        r = await http.post(API + "/repos/octo/r/issues", json={"title": "x"})
        self.assertEqual((r.status_code, r.json()), (201, {"method": "POST"}))
        await http.aclose()

    @in_loop
    async def test_coordd_unreachable_is_a_connect_error(self):
        gone = coordd.AsyncClient(closed_port(), retry=coordd.RetryPolicy(max_attempts=1))
        http = httpx.AsyncClient(transport=coordd.httpx.AsyncTransport(gone))
        try:
            with self.assertRaises(httpx.ConnectError):
                await http.get(API + "/repos/octo/r/readme")
        finally:
            await http.aclose()
            await gone.close()

    @in_loop
    async def test_body_streams_as_the_chunks_arrive(self):
        docs = coordd.AsyncClient(TARGET)
        http = httpx.AsyncClient(transport=coordd.httpx.AsyncTransport(docs))
        try:
            async with http.stream("GET", UPSTREAM + "/docs/big") as r:
                pieces = [p async for p in r.aiter_raw()]
            self.assertEqual(len(pieces), -(-300000 // CHUNK_SIZE))
            self.assertEqual(hashlib.sha256(b"".join(pieces)).hexdigest(), BIG_SHA256)
            async with http.stream("GET", UPSTREAM + "/docs/big") as r:
                async for _ in r.aiter_raw():
                    break
            self.assertEqual(len((await http.get(UPSTREAM + "/docs/big")).content), 300000)
        finally:
            await http.aclose()
            await docs.close()


if __name__ == "__main__":
    unittest.main()
