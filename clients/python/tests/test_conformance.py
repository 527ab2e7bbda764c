"""The client conformance corpus (testdata/client-conformance; the Go and
TypeScript clients play the same cases): Client.get and AsyncClient.get
against the scripted fake coordd of internal/testing/clientconformance, which
clients/python/python_test.go starts. The environment tells where:

  COORDD_CONFORMANCE_TARGET   the fake's gRPC address
  COORDD_CONFORMANCE_CONTROL  its control endpoint (GET ?url=URL: what it saw)
  COORDD_CONFORMANCE_CORPUS   the corpus directory

A case or field this runner does not know fails it; none is skipped.
"""

import json
import os
import unittest
import urllib.parse
import urllib.request

import grpc

import coordd
from coordd.v1 import coordd_pb2

TARGET = os.environ["COORDD_CONFORMANCE_TARGET"]
CONTROL = os.environ["COORDD_CONFORMANCE_CONTROL"]
CORPUS = os.environ["COORDD_CONFORMANCE_CORPUS"]

CLIENT_KEYS = {"max_attempts", "initial_backoff_ms", "max_backoff_ms", "timeout_ms", "max_body_bytes"}
STEP_KEYS = {"progress", "metadata", "chunk", "unknown_event", "status", "cut"}


def keys(obj, known, where):
    """obj, a dict, if every key of it is one of known."""
    if not isinstance(obj, dict):
        raise AssertionError(f"{where}: not an object")
    unknown = set(obj) - set(known)
    if unknown:
        raise AssertionError(f"{where}: unknown fields {sorted(unknown)}")
    return obj


def load():
    """The corpus's cases, each with its client defaults filled in."""
    with open(os.path.join(CORPUS, "cases.json"), encoding="utf-8") as f:
        file = keys(json.load(f), {"comment", "client", "cases"}, "cases.json")
    defaults = keys(file["client"], CLIENT_KEYS, "client")
    cases = file["cases"]
    if not cases:
        raise AssertionError("cases.json has no cases")
    out = []
    for i, c in enumerate(cases):
        keys(c, {"name", "about", "client", "call", "attempts", "want"}, f"case {i}")
        where = f"case {c['name']}"
        c["client"] = {**defaults, **keys(c.get("client", {}), CLIENT_KEYS, f"{where}: client")}
        for attempt in c["attempts"]:
            for step in attempt:
                if len(keys(step, STEP_KEYS, f"{where}: step")) != 1:
                    raise AssertionError(f"{where}: a step does one thing")
        call = keys(c.get("call", {}), {"priority"}, f"{where}: call")
        if call.get("priority") not in (None, "interactive", "background"):
            raise AssertionError(f"{where}: call.priority {call['priority']!r}")
        want = keys(c["want"], {"document", "error", "attempts", "min_gaps_ms", "priority"}, f"{where}: want")
        coordd_pb2.Priority.Value(want_priority(c))  # raises on a priority it does not know
        if ("document" in want) == ("error" in want):
            raise AssertionError(f"{where}: want document or error")
        if "document" in want:
            keys(want["document"], {"body", "status_code", "content_type", "etag", "progress"}, f"{where}: want.document")
            for p in want["document"].get("progress", []):
                coordd_pb2.Stage.Value(p)  # raises on a stage it does not know
        else:
            error_check(want["error"])  # raises on a name it does not know
        out.append(c)
    return out


def want_priority(case):
    """The priority, by name, every attempt of case must carry."""
    return case["want"].get("priority", "PRIORITY_UNSPECIFIED")


def error_check(name):
    """A check of an exception against a want.error name."""
    if name == "bad_stream":
        return lambda e: isinstance(e, coordd.BadStreamError)
    if name == "body_too_large":
        return lambda e: isinstance(e, coordd.BodyTooLargeError)
    code = grpc.StatusCode[name]  # raises KeyError on a name it does not know
    if code == grpc.StatusCode.OK:
        raise AssertionError("want.error OK")
    return lambda e: isinstance(e, coordd.CoorddError) and e.code == code


def record(url):
    """What the fake saw of the calls for url."""
    q = urllib.parse.urlencode({"url": url})
    with urllib.request.urlopen(f"{CONTROL}?{q}", timeout=10) as r:
        return json.load(r)


def options(case):
    cc = case["client"]
    retry = coordd.RetryPolicy(
        max_attempts=cc["max_attempts"],
        initial_backoff=cc["initial_backoff_ms"] / 1000,
        max_backoff=cc["max_backoff_ms"] / 1000,
    )
    return dict(retry=retry, max_body_bytes=cc["max_body_bytes"]), cc["timeout_ms"] / 1000


class Checks:
    """The assertions on one case's outcome, for both clients' tests."""

    def check(self, case, url, doc, err):
        want = case["want"]
        if "document" in want:
            self.assertIsNone(err, f"get failed: {err}")
            wd = want["document"]
            got = {
                "body": doc.body.decode("utf-8"),
                "status_code": doc.status_code,
                "content_type": doc.content_type,
                "etag": doc.etag,
                "progress": [coordd_pb2.Stage.Name(p.stage) for p in doc.progress],
            }
            self.assertEqual(got, {**wd, "progress": wd.get("progress", [])})
        else:
            self.assertIsNotNone(err, "get returned a document; want an error")
            self.assertTrue(error_check(want["error"])(err), f"{type(err).__name__} {err}; want {want['error']}")
        rec = record(url)
        self.assertEqual(rec["problems"], [], "the fake could not play the calls")
        self.assertEqual(rec["attempts"], want["attempts"], "attempts")
        self.assertEqual(rec["priorities"], [want_priority(case)] * rec["attempts"], "each attempt's priority")
        for i, least in enumerate(want.get("min_gaps_ms", [])):
            gap = rec["gaps_ms"][i] if i < len(rec["gaps_ms"]) else float("inf")
            self.assertGreaterEqual(gap, least, f"wait before attempt {i + 2}")


class ClientConformanceTest(Checks, unittest.TestCase):
    def test_corpus(self):
        cases = load()
        ran = 0
        for case in cases:
            with self.subTest(case=case["name"]):
                ran += 1
                url = f"http://conformance.test/{case['name']}/py"
                opts, timeout = options(case)
                doc, err = None, None
                with coordd.Client(TARGET, **opts) as client:
                    try:
                        doc = client.get(url, timeout=timeout, priority=case.get("call", {}).get("priority"))
                    except coordd.CoorddError as e:
                        err = e
                self.check(case, url, doc, err)
        self.assertEqual(ran, len(cases))


class AsyncClientConformanceTest(Checks, unittest.IsolatedAsyncioTestCase):
    # One event loop for every case: grpc.aio does not survive a loop closed
    # under it (one asyncio.run per case).
    async def test_corpus(self):
        cases = load()
        ran = 0
        for case in cases:
            with self.subTest(case=case["name"]):
                ran += 1
                url = f"http://conformance.test/{case['name']}/py-aio"
                opts, timeout = options(case)
                doc, err = None, None
                async with coordd.AsyncClient(TARGET, **opts) as client:
                    try:
                        doc = await client.get(url, timeout=timeout, priority=case.get("call", {}).get("priority"))
                    except coordd.CoorddError as e:
                        err = e
                self.check(case, url, doc, err)
        self.assertEqual(ran, len(cases))


if __name__ == "__main__":
    unittest.main()
