"""coordd's one rendering of an answer as HTTP (docs/api.md, "One
rendering"): coordd.httpx renders every case of testdata/http-rendering,
the file the HTTP door's and the Go and TypeScript drop-ins' tests read,
and tells a request coordd does not carry by the status's reason alone.
The cases' statuses arrive as coordd sends them: a grpc-status-details-bin
trailer with an ErrorInfo and a RetryInfo, decoded by the client's own
error_from."""

import json
import os
import unittest

import grpc
import httpx
from google.protobuf import any_pb2, json_format

import coordd.httpx
from coordd import _common as c
from coordd._vendor.google.rpc import error_details_pb2, status_pb2
from coordd.v1 import coordd_pb2

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "testdata", "http-rendering", "cases.json")


def load():
    with open(CASES, encoding="utf-8") as f:
        return json.load(f)


def error_of(case) -> c.CoorddError:
    """The case's status as the client decodes coordd's trailer."""
    code = grpc.StatusCode[case["code"]]
    st = status_pb2.Status(code=code.value[0], message=case["message"])
    if "reason" in case:
        a = any_pb2.Any()
        a.Pack(error_details_pb2.ErrorInfo(reason=case["reason"], domain=case.get("domain", "coordd")))
        st.details.append(a)
    if "retry_delay" in case:
        ri = error_details_pb2.RetryInfo()
        ri.retry_delay.FromJsonString(case["retry_delay"])
        a = any_pb2.Any()
        a.Pack(ri)
        st.details.append(a)
    trailer = [("grpc-status-details-bin", st.SerializeToString())]
    return c.error_from(code, case["message"], trailer, "Error received from peer")


class RenderingTest(unittest.TestCase):
    def setUp(self):
        self.cases = load()
        self.assertTrue(self.cases["documents"] and self.cases["errors"])
        self.request = httpx.Request("GET", "https://developer.mozilla.org/x")

    def check_headers(self, name, headers: httpx.Headers, want, absent):
        for k, v in (want or {}).items():
            self.assertEqual(headers.get_list(k), v, f"{name}: {k}")
        for k in absent or ():
            self.assertNotIn(k, headers, f"{name}: {k} must be absent")

    def test_documents(self):
        for d in self.cases["documents"]:
            md = json_format.ParseDict(d["metadata"], coordd_pb2.Metadata())
            opened = c.Opened(metadata=md, progress=(), chunks=iter(()), cancel=lambda: None)
            res = coordd.httpx._response(self.request, opened, httpx.ByteStream(b""))
            self.assertEqual(res.status_code, d["status"], d["name"])
            self.check_headers(d["name"], res.headers, d.get("headers"), d.get("absent"))

    def test_errors(self):
        for e in self.cases["errors"]:
            err = error_of(e)
            if e["drop_in"] == "response":
                res = coordd.httpx._failed(self.request, err)
                self.assertIsInstance(res, httpx.Response, e["name"])
                self.assertEqual(res.status_code, e["status"], e["name"])
                self.check_headers(e["name"], res.headers, e.get("headers"), e.get("absent"))
                self.assertEqual(json.loads(res.content), e["body"], e["name"])
            elif e["drop_in"] == "not_carried":
                why = coordd.httpx._failed(self.request, err)
                self.assertIsInstance(why, str, e["name"])
            elif e["drop_in"] == "error":
                with self.assertRaises(coordd.httpx.RefusedError, msg=e["name"]):
                    coordd.httpx._failed(self.request, err)
            else:
                self.fail(f"{e['name']}: drop_in {e['drop_in']!r}")


if __name__ == "__main__":
    unittest.main()
