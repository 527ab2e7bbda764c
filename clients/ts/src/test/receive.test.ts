// CoorddClient.get against a stub gRPC server that streams a scripted
// GetOrFetch answer: bodies that do not match their metadata's size, or
// that exceed the client's maxBodyBytes.

import assert from "node:assert/strict";
import { createServer, type Http2Server } from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { create, toBinary } from "@bufbuild/protobuf";

import { BodyTooLargeError, Code, ConnectError, CoorddClient, GetOrFetchResponseSchema, type GetOrFetchResponse } from "../client.js";

let server: Http2Server;
let addr = "";
const calls = new Map<string, number>(); // x-test-id header → calls
const closed = new Set<string>(); // x-test-id of the calls whose stream closed

/** envelope frames msg as one gRPC message. */
function envelope(msg: GetOrFetchResponse): Uint8Array {
  const bytes = toBinary(GetOrFetchResponseSchema, msg);
  const out = new Uint8Array(5 + bytes.length);
  new DataView(out.buffer).setUint32(1, bytes.length);
  out.set(bytes, 5);
  return out;
}

function metadata(size: bigint): Uint8Array {
  return envelope(create(GetOrFetchResponseSchema, { event: { case: "metadata", value: { statusCode: 200, size } } }));
}

const chunk = envelope(create(GetOrFetchResponseSchema, { event: { case: "chunk", value: { data: new Uint8Array(1024).fill(120) } } }));

// Each call announces the size in its x-size header, then sends x-chunks
// chunks of 1 KiB ("endless": until the client goes away).
before(async () => {
  server = createServer((req, res) => {
    const id = String(req.headers["x-test-id"]);
    calls.set(id, (calls.get(id) ?? 0) + 1);
    res.once("close", () => closed.add(id));
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/grpc+proto" });
      res.write(metadata(BigInt(String(req.headers["x-size"]))));
      const chunks = String(req.headers["x-chunks"]);
      let sent = 0;
      const more = (): void => {
        while (!res.destroyed && (chunks === "endless" || sent < Number(chunks))) {
          sent++;
          if (!res.write(chunk)) {
            res.once("drain", more);
            return;
          }
        }
        if (!res.destroyed) {
          res.addTrailers({ "grpc-status": "0" });
          res.end();
        }
      };
      more();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  addr = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => new Promise<void>((resolve) => server.close(() => resolve())));

test("a body that differs from the metadata's size fails the call", { timeout: 20_000 }, async (t) => {
  const cases: { name: string; size: string; chunks: string; message: RegExp }[] = [
    { name: "more than the size, then ends", size: "2048", chunks: "4", message: /exceeds the 2048 bytes/ },
    { name: "more than the size, endless", size: "2048", chunks: "endless", message: /exceeds the 2048 bytes/ },
    { name: "empty document, endless", size: "0", chunks: "endless", message: /exceeds the 0 bytes/ },
    { name: "negative size", size: "-1", chunks: "endless", message: /size -1/ },
    { name: "huge size, short body", size: String(1n << 62n), chunks: "4", message: /body is 4096 bytes/ },
    { name: "less than the size", size: "8192", chunks: "4", message: /body is 4096 bytes/ },
  ];
  // The deadline only bounds a failing test.
  const client = new CoorddClient(addr, { retry: { attempts: 1 }, timeoutMs: 10_000 });
  try {
    for (const c of cases) {
      await t.test(c.name, async () => {
        const err = await client.get("http://mdn.test/x", { headers: { "x-size": c.size, "x-chunks": c.chunks } }).then(
          () => assert.fail("resolved"),
          (e: unknown) => e,
        );
        assert.ok(err instanceof ConnectError, String(err));
        assert.equal(Code[err.code], Code[Code.Internal], err.message);
        assert.match(err.message, c.message);
      });
    }
  } finally {
    client.close();
  }
});

test("a body of the announced size, in several chunks, is reassembled", async () => {
  const client = new CoorddClient(addr, { retry: { attempts: 1 } });
  try {
    const doc = await client.get("http://mdn.test/x", { headers: { "x-size": "3072", "x-chunks": "3" } });
    assert.equal(doc.body.length, 3072);
    assert.ok(doc.body.every((b) => b === 120), "body bytes differ");
  } finally {
    client.close();
  }
});

test("a body announced above maxBodyBytes fails on its metadata, and its stream is cancelled", { timeout: 30_000 }, async () => {
  // Retries allowed, and a deadline that outlasts the wait below: only the
  // client's cancellation can end the endless stream in time.
  const client = new CoorddClient(addr, { maxBodyBytes: 2048, retry: { attempts: 4, baseDelayMs: 1 }, timeoutMs: 60_000 });
  const id = "too large";
  try {
    const err = await client.get("http://mdn.test/x", { headers: { "x-test-id": id, "x-size": "2049", "x-chunks": "endless" } }).then(
      () => assert.fail("resolved"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof BodyTooLargeError, String(err));
    assert.equal(Code[err.code], Code[Code.FailedPrecondition]);
    assert.equal(err.size, 2049n);
    assert.equal(err.limit, 2048);
    assert.match(err.message, /2049 bytes; the limit is 2048/);
    assert.equal(calls.get(id), 1, "retried");
    for (const deadline = Date.now() + 10_000; !closed.has(id); await new Promise((r) => setTimeout(r, 20))) {
      assert.ok(Date.now() < deadline, "the server's stream was still open 10 s after get failed");
    }

    // A body of exactly the limit is accepted.
    const doc = await client.get("http://mdn.test/x", { headers: { "x-test-id": "at the limit", "x-size": "2048", "x-chunks": "2" } });
    assert.equal(doc.body.length, 2048);
  } finally {
    client.close();
  }
});
