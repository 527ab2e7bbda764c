// CoorddClient.get against a stub gRPC server that answers every call with
// a fixed status: the retry policy, seen from the wire.

import assert from "node:assert/strict";
import { createServer, type Http2Server } from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { Code, ConnectError, CoorddClient } from "../client.js";

let server: Http2Server;
let addr = "";
const calls = new Map<string, number>(); // x-test-id header → calls

// Each call's status is chosen by its x-want-status header.
before(async () => {
  server = createServer((req, res) => {
    const id = String(req.headers["x-test-id"]);
    calls.set(id, (calls.get(id) ?? 0) + 1);
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/grpc+proto" });
      res.addTrailers({ "grpc-status": String(req.headers["x-want-status"]), "grpc-message": "stub" });
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  addr = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => new Promise<void>((resolve) => server.close(() => resolve())));

test("get retries Unavailable and ResourceExhausted, nothing else", async (t) => {
  const cases: { name: string; status: Code; attempts: number; wantCalls: number }[] = [
    { name: "Unavailable is retried up to attempts", status: Code.Unavailable, attempts: 3, wantCalls: 3 },
    { name: "ResourceExhausted is retried", status: Code.ResourceExhausted, attempts: 2, wantCalls: 2 },
    { name: "attempts 1 turns retries off", status: Code.Unavailable, attempts: 1, wantCalls: 1 },
    { name: "PermissionDenied is not retried", status: Code.PermissionDenied, attempts: 3, wantCalls: 1 },
    { name: "InvalidArgument is not retried", status: Code.InvalidArgument, attempts: 3, wantCalls: 1 },
  ];
  const client = new CoorddClient(addr, { retry: { baseDelayMs: 5 } });
  try {
    for (const c of cases) {
      await t.test(c.name, async () => {
        const err = await client
          .get("http://mdn.test/x", {
            retry: { attempts: c.attempts },
            headers: { "x-test-id": c.name, "x-want-status": String(c.status) },
          })
          .then(
            () => assert.fail("resolved"),
            (e: unknown) => e,
          );
        assert.ok(err instanceof ConnectError, String(err));
        assert.equal(Code[err.code], Code[c.status]);
        assert.equal(calls.get(c.name), c.wantCalls);
      });
    }
  } finally {
    client.close();
  }
});

test("an aborted signal stops the retries", { timeout: 10_000 }, async () => {
  const client = new CoorddClient(addr, { retry: { attempts: 100, baseDelayMs: 60_000, maxDelayMs: 60_000 }, timeoutMs: 0 });
  const ac = new AbortController();
  try {
    const p = client.get("http://mdn.test/x", {
      signal: ac.signal,
      headers: { "x-test-id": "abort", "x-want-status": String(Code.Unavailable) },
    });
    setTimeout(() => ac.abort(), 50);
    const err = await p.then(
      () => assert.fail("resolved"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ConnectError, String(err));
    assert.equal(Code[err.code], Code[Code.Canceled]);
  } finally {
    client.close();
  }
});

test("a backoff that would outlast the deadline ends the call with the last error", { timeout: 10_000 }, async () => {
  const client = new CoorddClient(addr, { retry: { attempts: 100, baseDelayMs: 1e9, maxDelayMs: 1e9 }, timeoutMs: 1_000 });
  try {
    const err = await client
      .get("http://mdn.test/x", { headers: { "x-test-id": "deadline", "x-want-status": String(Code.Unavailable) } })
      .then(
        () => assert.fail("resolved"),
        (e: unknown) => e,
      );
    assert.ok(err instanceof ConnectError, String(err));
    assert.equal(Code[err.code], Code[Code.Unavailable]);
    assert.equal(calls.get("deadline"), 1);
  } finally {
    client.close();
  }
});
