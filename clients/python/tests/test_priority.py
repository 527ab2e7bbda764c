"""A call's priority from the Python client: Client.get and AsyncClient.get
refuse one they do not know before any call (the conformance corpus checks
what they send), and coordd.httpx's transports take it from the
X-Coordd-Priority header, or their priority option, and send the header
nowhere. Against the conformance corpus's fake coordd, which records the
priority of each call it gets (see test_conformance.py for the
environment): its cases priority-background and priority-interactive
answer any url under them.
"""

import json
import os
import unittest
import urllib.parse
import urllib.request

import httpx

import coordd
import coordd.httpx

TARGET = os.environ["COORDD_CONFORMANCE_TARGET"]
CONTROL = os.environ["COORDD_CONFORMANCE_CONTROL"]


def priorities(url):
    """The priority of each call the fake got for url, by name."""
    q = urllib.parse.urlencode({"url": url})
    with urllib.request.urlopen(f"{CONTROL}?{q}", timeout=10) as r:
        rec = json.load(r)
    if rec["problems"]:
        raise AssertionError(f"the fake could not play the calls: {rec['problems']}")
    return rec["priorities"]


# The fake's cases: background's first attempt fails UNAVAILABLE, so that
# the retry's priority is checked too.
BACKGROUND = ("priority-background", ["PRIORITY_BACKGROUND"] * 2)
INTERACTIVE = ("priority-interactive", ["PRIORITY_INTERACTIVE"])


def client_options():
    return dict(retry=coordd.RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.002))


class ClientPriorityTest(unittest.TestCase):
    def test_unknown_priority_is_refused_before_any_call(self):
        url = "http://conformance.test/priority-background/py-refused"
        with coordd.Client(TARGET, **client_options()) as client:
            for p in ("urgent", "BACKGROUND", 2):
                with self.subTest(priority=p), self.assertRaises(coordd.InvalidArgumentError):
                    client.get(url, priority=p)
        self.assertEqual(priorities(url), [])


class AsyncClientPriorityTest(unittest.IsolatedAsyncioTestCase):
    async def test_unknown_priority_is_refused_before_any_call(self):
        url = "http://conformance.test/priority-background/py-aio-refused"
        async with coordd.AsyncClient(TARGET, **client_options()) as client:
            with self.assertRaises(coordd.InvalidArgumentError):
                await client.get(url, priority="urgent")
        self.assertEqual(priorities(url), [])


# (name, transport options, request headers, case): what each request sends.
TRANSPORT_CASES = [
    ("header background", {}, {"X-Coordd-Priority": "background"}, BACKGROUND),
    ("header in another case", {}, {"x-coordd-priority": " Background "}, BACKGROUND),
    ("header interactive", {}, {coordd.httpx.PRIORITY_HEADER: "interactive"}, INTERACTIVE),
    ("transport background", {"priority": "background"}, {}, BACKGROUND),
    ("header over the transport's", {"priority": "background"}, {coordd.httpx.PRIORITY_HEADER: "interactive"}, INTERACTIVE),
]


class TransportPriorityTest(unittest.TestCase):
    def setUp(self):
        self.client = coordd.Client(TARGET, **client_options())
        self.addCleanup(self.client.close)

    def test_priority(self):
        for name, opts, headers, (case, want) in TRANSPORT_CASES:
            with self.subTest(name):
                url = f"http://conformance.test/{case}/py-httpx-{name.replace(' ', '-').replace(chr(39), '')}"
                with httpx.Client(transport=coordd.httpx.Transport(self.client, **opts)) as http:
                    r = http.get(url, headers=headers)
                self.assertEqual((r.status_code, r.text), (200, "ok"))
                self.assertEqual(priorities(url), want)

    def test_unknown_header_value_is_refused_before_any_call(self):
        url = "http://conformance.test/priority-background/py-httpx-refused"
        with httpx.Client(transport=coordd.httpx.Transport(self.client)) as http:
            for v in (["urgent"], ["background", "background"]):
                with self.subTest(v), self.assertRaises(coordd.httpx.RefusedError) as cm:
                    http.get(url, headers=[(coordd.httpx.PRIORITY_HEADER, x) for x in v])
                self.assertIsInstance(cm.exception.coordd_error, coordd.InvalidArgumentError)
                self.assertIn(coordd.httpx.PRIORITY_HEADER, str(cm.exception))
        self.assertEqual(priorities(url), [])

    def test_unknown_transport_priority(self):
        with self.assertRaises(ValueError):
            coordd.httpx.Transport(self.client, priority="urgent")

    def test_fallback_gets_no_priority_header(self):
        seen = []

        def fallback(request):
            seen.append(request)
            return httpx.Response(201)

        transport = coordd.httpx.Transport(self.client, fallback=httpx.MockTransport(fallback))
        with httpx.Client(transport=transport) as http:
            r = http.post("http://conformance.test/priority-background/py-httpx-post",
                          headers={coordd.httpx.PRIORITY_HEADER: "background", "X-Other": "1"}, content=b"body")
        self.assertEqual(r.status_code, 201)
        self.assertEqual(len(seen), 1)
        self.assertNotIn(coordd.httpx.PRIORITY_HEADER, seen[0].headers)
        self.assertEqual(seen[0].headers["x-other"], "1")
        self.assertEqual(seen[0].read(), b"body")
        self.assertEqual(r.request.headers[coordd.httpx.PRIORITY_HEADER], "background")


class AsyncTransportPriorityTest(unittest.IsolatedAsyncioTestCase):
    async def test_priority(self):
        async with coordd.AsyncClient(TARGET, **client_options()) as client:
            for name, opts, headers, (case, want) in TRANSPORT_CASES:
                with self.subTest(name):
                    url = f"http://conformance.test/{case}/py-ahttpx-{name.replace(' ', '-').replace(chr(39), '')}"
                    async with httpx.AsyncClient(transport=coordd.httpx.AsyncTransport(client, **opts)) as http:
                        r = await http.get(url, headers=headers)
                    self.assertEqual((r.status_code, r.text), (200, "ok"))
                    self.assertEqual(priorities(url), want)
            url = "http://conformance.test/priority-background/py-ahttpx-refused"
            async with httpx.AsyncClient(transport=coordd.httpx.AsyncTransport(client)) as http:
                with self.assertRaises(coordd.httpx.RefusedError):
                    await http.get(url, headers={coordd.httpx.PRIORITY_HEADER: "urgent"})
            self.assertEqual(priorities(url), [])


if __name__ == "__main__":
    unittest.main()
