"""The clients send the caller's W3C trace context (traceparent) when
opentelemetry-api is importable and a span is active, and coordd's server
span is its child.

Debian packages no opentelemetry-api for Python (apt-cache search
opentelemetry finds only the Go one), so a script runs with a minimal
stand-in for it on sys.path (OTEL_STUB: the names the script and the client
use, as opentelemetry-api 1.x has them; the script runs unchanged on the
real package). clients/python/python_test.go starts:

  COORDD_TRACED_TARGET    a coordd whose gRPC server extracts W3C trace
                          context, in front of COORDD_TRACED_UPSTREAM
  COORDD_SPANS_URL        answers GET ?trace_id=HEX with that coordd's
                          server spans of the trace, as JSON, once there is
                          one
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
import urllib.parse
import urllib.request

from coordd import _common

TRACED_TARGET = os.environ["COORDD_TRACED_TARGET"]
TRACED_UPSTREAM = os.environ["COORDD_TRACED_UPSTREAM"]
SPANS_URL = os.environ["COORDD_SPANS_URL"]


OTEL_STUB = {
    "opentelemetry/__init__.py": "",
    "opentelemetry/trace/__init__.py": '''
import contextlib
import contextvars


class TraceFlags(int):
    SAMPLED = 0x01


class SpanContext:
    def __init__(self, trace_id, span_id, is_remote, trace_flags=TraceFlags(0), trace_state=None):
        self.trace_id, self.span_id, self.is_remote = trace_id, span_id, is_remote
        self.trace_flags, self.trace_state = trace_flags, trace_state

    @property
    def is_valid(self):
        return self.trace_id != 0 and self.span_id != 0


INVALID_SPAN_CONTEXT = SpanContext(0, 0, False)


class NonRecordingSpan:
    def __init__(self, context):
        self._context = context

    def get_span_context(self):
        return self._context


INVALID_SPAN = NonRecordingSpan(INVALID_SPAN_CONTEXT)
_current = contextvars.ContextVar("current_span", default=INVALID_SPAN)


def get_current_span(context=None):
    return _current.get()


@contextlib.contextmanager
def use_span(span, end_on_exit=False):
    token = _current.set(span)
    try:
        yield span
    finally:
        _current.reset(token)
''',
    "opentelemetry/trace/propagation/__init__.py": "",
    "opentelemetry/trace/propagation/tracecontext.py": '''
from opentelemetry import trace


class TraceContextTextMapPropagator:
    def inject(self, carrier, context=None, setter=None):
        sc = trace.get_current_span(context).get_span_context()
        if not sc.is_valid:
            return
        carrier["traceparent"] = "00-%032x-%016x-%02x" % (sc.trace_id, sc.span_id, sc.trace_flags)
''',
}

TRACED_SCRIPT = '''
import asyncio, json, sys
import httpx
from opentelemetry import trace
import coordd, coordd.httpx

target, upstream = sys.argv[1], sys.argv[2]
url = upstream + "hello"
spans = {}


def span(name):
    n = len(spans) + 1
    ids = (0x0AF7651916CD43DD8448EB211C800000 + n, 0xB7AD6B7169200000 + n)
    spans[name] = ["%032x" % ids[0], "%016x" % ids[1]]
    return trace.use_span(trace.NonRecordingSpan(trace.SpanContext(
        trace_id=ids[0], span_id=ids[1], is_remote=False, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))))


with coordd.Client(target) as client:
    with span("Client.get"):
        assert client.get(url).body == b"traced\\n"
    with span("Transport"):
        with httpx.Client(transport=coordd.httpx.Transport(client)) as http:
            assert http.get(url).text == "traced\\n"


async def main():
    async with coordd.AsyncClient(target) as client:
        with span("AsyncClient.get"):
            assert (await client.get(url)).body == b"traced\\n"
        with span("AsyncTransport"):
            async with httpx.AsyncClient(transport=coordd.httpx.AsyncTransport(client)) as http:
                assert (await http.get(url)).text == "traced\\n"


asyncio.run(main())
print(json.dumps(spans))
'''


class TraceContextTest(unittest.TestCase):
    def test_no_trace_context_without_a_span(self):
        # Here opentelemetry-api is missing (Debian packages none), or has
        # no active span: nothing is sent and nothing fails.
        self.assertEqual(_common.trace_metadata(), ())

    def test_traceparent_reaches_coordd(self):
        # Every call carries the active span's W3C trace context when
        # opentelemetry-api is importable: coordd's server span is its child.
        with tempfile.TemporaryDirectory() as stub:
            for name, src in OTEL_STUB.items():
                os.makedirs(os.path.dirname(os.path.join(stub, name)), exist_ok=True)
                with open(os.path.join(stub, name), "w") as f:
                    f.write(textwrap.dedent(src))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([stub, os.environ.get("PYTHONPATH", "")]))
            p = subprocess.run([sys.executable, "-c", TRACED_SCRIPT, TRACED_TARGET, TRACED_UPSTREAM],
                               capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        spans = json.loads(p.stdout)
        self.assertEqual(len(spans), 4)
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
        for caller, (trace_id, span_id) in spans.items():
            with self.subTest(caller):
                with direct.open(SPANS_URL + "?" + urllib.parse.urlencode({"trace_id": trace_id}), timeout=30) as r:
                    got = json.load(r)
                self.assertIn({"name": "coordd.v1.CoordinatorService/GetOrFetch", "trace_id": trace_id,
                               "parent_span_id": span_id}, got)


if __name__ == "__main__":
    unittest.main()
