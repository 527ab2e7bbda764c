"""Tests of the coordd client against a real coordd and a local upstream.

clients/python/python_test.go starts them and runs these tests with
/usr/bin/python3 -m unittest; the environment tells where:

  COORDD_TARGET       coordd (plaintext, no tenants)
  COORDD_UPSTREAM     the local upstream's base URL; coordd serves
                      {upstream}/docs/ (as "docs") and {upstream}/flaky/ (as
                      "flaky": no retries, its breaker opens on one failure
                      and stays open 4 s)
  COORDD_AUTH_TARGET  coordd with one tenant, whose token is COORDD_TOKEN
  COORDD_BIG_SHA256   the SHA-256 of {upstream}/docs/big (300,000 bytes)
  COORDD_API_URL, COORDD_API_TARGETS, COORDD_API_TOKENS: a fake API with
                      credentials, behind coordd (see test_httpx.py)
"""

import asyncio
import hashlib
import os
import subprocess
import sys
import time
import unittest

import coordd

TARGET = os.environ["COORDD_TARGET"]
UPSTREAM = os.environ["COORDD_UPSTREAM"]
AUTH_TARGET = os.environ["COORDD_AUTH_TARGET"]
TOKEN = os.environ["COORDD_TOKEN"]
BIG_SHA256 = os.environ["COORDD_BIG_SHA256"]
API = os.environ["COORDD_API_URL"]
API_TARGET = os.environ["COORDD_API_TARGETS"].split(",")[0]
API_TOKENS = dict(kv.split("=", 1) for kv in os.environ["COORDD_API_TOKENS"].split(","))

HELLO = UPSTREAM + "/docs/hello"
HELLO_BODY = b"hello from the upstream\n"


class RecordingClient(coordd.Client):
    """A Client that records the waits before its retries."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waits = []

        def sleep(s):
            self.waits.append(s)
            time.sleep(s)

        self._sleep = sleep


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.client = RecordingClient(TARGET)
        self.addCleanup(self.client.close)

    def test_get(self):
        doc = self.client.get(HELLO)
        self.assertEqual(doc.body, HELLO_BODY)
        self.assertEqual(doc.status_code, 200)
        self.assertEqual(doc.content_type, "text/plain; charset=utf-8")
        self.assertTrue(doc.etag)
        self.assertIn(doc.source, ("upstream", "l1"))
        self.assertFalse(doc.stale)
        self.assertEqual(doc.key, HELLO)
        self.assertEqual(doc.upstream, "docs")
        self.assertLess(abs(time.time() - doc.fetched_at.timestamp()), 60)
        again = self.client.get(HELLO, max_age=3600)
        self.assertEqual(again.source, "l1")
        self.assertEqual(again.body, HELLO_BODY)

    def test_large_body_reassembled(self):
        doc = self.client.get(UPSTREAM + "/docs/big")
        self.assertEqual(len(doc.body), 300000)
        self.assertEqual(hashlib.sha256(doc.body).hexdigest(), BIG_SHA256)

    def test_404_is_a_document(self):
        doc = self.client.get(UPSTREAM + "/docs/missing")
        self.assertEqual(doc.status_code, 404)
        self.assertEqual(doc.body, b"Not Found\n")

    def test_permission_denied(self):
        with self.assertRaises(coordd.PermissionDeniedError) as cm:
            self.client.get("https://evil.example/docs/x")
        self.assertIn("outside every configured upstream", str(cm.exception))
        self.assertEqual(self.client.waits, [], "PERMISSION_DENIED was retried")

    def test_invalid_argument(self):
        for url in ("not a url", UPSTREAM + "/docs/%2e%2e/x", "ftp://example.com/x"):
            with self.subTest(url=url):
                with self.assertRaises(coordd.InvalidArgumentError):
                    self.client.get(url)
        with self.assertRaises(coordd.InvalidArgumentError):
            self.client.get(HELLO, max_age=-1)
        self.assertEqual(self.client.waits, [], "INVALID_ARGUMENT was retried")

    def test_body_too_large_for_the_client(self):
        with coordd.Client(TARGET, max_body_bytes=10) as small:
            with self.assertRaises(coordd.BodyTooLargeError):
                small.get(HELLO)

    def test_invalidate(self):
        self.client.get(UPSTREAM + "/docs/gone")
        r = self.client.invalidate(url=UPSTREAM + "/docs/gone")
        self.assertEqual(r.key, UPSTREAM + "/docs/gone")
        self.assertEqual(self.client.get(UPSTREAM + "/docs/gone").source, "upstream")

    def test_tenants(self):
        with coordd.Client(AUTH_TARGET) as anon:
            with self.assertRaises(coordd.UnauthenticatedError):
                anon.get(HELLO)
        with coordd.Client(AUTH_TARGET, token="not-the-token-0123456789") as wrong:
            with self.assertRaises(coordd.UnauthenticatedError):
                wrong.get(HELLO)
        with coordd.Client(AUTH_TARGET, token=TOKEN) as ok:
            self.assertEqual(ok.get(HELLO).body, HELLO_BODY)
            with self.assertRaises(coordd.PermissionDeniedError):  # the tenant is no admin
                ok.invalidate(url=HELLO)

    def test_retry_after_retry_info(self):
        # One failure opens the flaky upstream's breaker for 4 s.
        with coordd.Client(TARGET, retry=coordd.RetryPolicy(max_attempts=1)) as once:
            with self.assertRaises(coordd.UnavailableError):
                once.get(UPSTREAM + "/flaky/fail")
            with self.assertRaises(coordd.UnavailableError) as cm:
                once.get(UPSTREAM + "/flaky/ok")
        delay = cm.exception.retry_delay
        self.assertIsNotNone(delay, "no RetryInfo decoded from an open breaker")
        self.assertGreater(delay, 0.5)
        self.assertLessEqual(delay, 4.0)
        # Backoff alone never waits more than 50 ms here: a longer wait is
        # the RetryInfo's, after which the half-open breaker lets it through.
        patient = RecordingClient(TARGET, retry=coordd.RetryPolicy(initial_backoff=0.01, max_backoff=0.05))
        self.addCleanup(patient.close)
        doc = patient.get(UPSTREAM + "/flaky/ok")
        self.assertEqual(doc.status_code, 200)
        self.assertTrue(patient.waits, "the call was not retried")
        self.assertGreater(max(patient.waits), 0.3, f"waits {patient.waits} ignore RetryInfo")


class CredentialTest(unittest.TestCase):
    def test_headers_credential_and_response_headers(self):
        url = API + "/repos/octo/plain/readme"
        raw = {"Accept": "application/vnd.github.raw"}
        with coordd.Client(API_TARGET) as client:
            doc = client.get(url, headers=raw, credential="Bearer " + API_TOKENS["bob"])
            self.assertEqual(doc.body, b"# plain\nread by bob\n")
            self.assertEqual(doc.content_type, "text/plain; charset=utf-8")
            self.assertTrue(doc.private)
            headers = {k.lower(): v for k, v in doc.headers}
            self.assertEqual(headers["x-ratelimit-resource"], "core")
            self.assertEqual(headers["cache-control"], "private, max-age=60, s-maxage=60")
            self.assertNotIn("set-cookie", headers)
            # Without a credential, coordd sends its own (login bot's): another copy.
            self.assertEqual(client.get(url, headers=list(raw.items())).body, b"# plain\nread by bot\n")
            # Invalidate removes bob's copy only.
            self.assertTrue(client.invalidate(url, headers=raw, credential="Bearer " + API_TOKENS["bob"]).existed)
            self.assertEqual(client.get(url, headers=raw, credential="Bearer " + API_TOKENS["bob"]).source, "upstream")
            self.assertNotEqual(client.get(url, headers=raw).source, "upstream")

    def test_unreachable(self):
        with coordd.Client("127.0.0.1:1", retry=coordd.RetryPolicy(max_attempts=1)) as gone:
            with self.assertRaises(coordd.UnreachableError) as cm:
                gone.get(HELLO)
        self.assertIsInstance(cm.exception, coordd.Unavailable)  # caught and retried as before


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    async def test_get_and_errors(self):
        async with coordd.AsyncClient(TARGET) as client:
            docs = await asyncio.gather(*(client.get(HELLO) for _ in range(5)))
            for doc in docs:
                self.assertEqual(doc.body, HELLO_BODY)
                self.assertEqual(doc.status_code, 200)
            missing = await client.get(UPSTREAM + "/docs/missing")
            self.assertEqual(missing.status_code, 404)
            with self.assertRaises(coordd.PermissionDeniedError):
                await client.get("https://evil.example/docs/x")
            with self.assertRaises(coordd.InvalidArgumentError):
                await client.get("not a url")
            big = await client.get(UPSTREAM + "/docs/big")
            self.assertEqual(hashlib.sha256(big.body).hexdigest(), BIG_SHA256)
        async with coordd.AsyncClient(AUTH_TARGET) as anon:
            with self.assertRaises(coordd.UnauthenticatedError):
                await anon.get(HELLO)


class CLITest(unittest.TestCase):
    def run_cli(self, *args):
        return subprocess.run([sys.executable, "-m", "coordd", *args], capture_output=True, timeout=60)

    def test_get_writes_the_body(self):
        p = self.run_cli("get", "--target", TARGET, HELLO)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, HELLO_BODY)

    def test_not_2xx(self):
        p = self.run_cli("get", "--target", TARGET, UPSTREAM + "/docs/missing")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertEqual(p.stdout, b"Not Found\n")
        self.assertIn(b"404", p.stderr)

    def test_refused(self):
        p = self.run_cli("get", "--target", TARGET, "https://evil.example/docs/x")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout, b"")
        self.assertIn(b"PERMISSION_DENIED", p.stderr)

    def test_token_from_the_environment(self):
        env = dict(os.environ, COORDD_TOKEN=TOKEN)
        p = subprocess.run([sys.executable, "-m", "coordd", "get", "--target", AUTH_TARGET, HELLO],
                           capture_output=True, timeout=60, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, HELLO_BODY)

    def test_usage(self):
        p = self.run_cli("get", HELLO)  # no --target
        self.assertEqual(p.returncode, 2)


class GeneratedCodeTest(unittest.TestCase):
    def test_no_runtime_version_checks(self):
        # Stubs generated by newer protoc and grpc plugins refuse older
        # runtimes (_runtime_version, GRPC_GENERATED_VERSION); these must
        # load on Debian 12's grpcio 1.51 / protobuf 3.21 and on newer ones.
        root = os.path.dirname(coordd.__file__)
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f.endswith(".py") and "_pb2" in f:
                    with open(os.path.join(dirpath, f)) as fh:
                        src = fh.read()
                    with self.subTest(file=f):
                        self.assertNotIn("_runtime_version", src)
                        self.assertNotIn("GRPC_GENERATED_VERSION", src)


if __name__ == "__main__":
    unittest.main()
