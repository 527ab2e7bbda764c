// testdata/mcp-golden/http.json against serveHTTP: the HTTP exchanges at
// /mcp that both MCP servers must answer the same way (the Go side,
// cmd/mdn-mcp's TestGoldenHTTP, runs both servers' processes against it).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { join } from "node:path";
import { test } from "node:test";

import { MDN } from "../mcp/mdn.js";
import { parseOrigins, serveHTTP } from "../mcp/http.js";
import { newServer } from "../mcp/tools.js";
import { REPO_ROOT } from "./harness.js";

const GOLDEN_DIR = join(REPO_ROOT, "testdata", "mcp-golden");

/** Case is one exchange of http.json (its "about" says how to run it). */
interface Case {
  name: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  raw?: string;
  status: number;
  close?: boolean;
  id?: unknown;
  result?: boolean;
  error?: number;
  message?: string;
}

// request is the bytes c sends to host.
function request(c: Case, host: string): Buffer {
  const expand = (s: string) => s.replaceAll("{host}", host).replaceAll("{port}", host.slice(host.lastIndexOf(":") + 1));
  if (c.raw !== undefined) return Buffer.from(expand(c.raw), "latin1");
  const h: Record<string, string> = {
    Host: host,
    "Content-Type": "application/json",
    Accept: "application/json, text/event-stream",
    "Mcp-Protocol-Version": "2025-06-18",
  };
  for (const [k, v] of Object.entries(c.headers ?? {})) h[k] = expand(v);
  if (c.body) h["Content-Length"] = String(Buffer.byteLength(c.body));
  const lines = Object.keys(h)
    .sort()
    .map((k) => `${k}: ${h[k]}\r\n`);
  return Buffer.from(`${c.method ?? "POST"} /mcp HTTP/1.1\r\n${lines.join("")}\r\n${c.body ?? ""}`);
}

/** Response is one HTTP response read off a socket. */
interface Response {
  status: number;
  headers: Map<string, string>; // lowercased names
  body: Buffer;
  rest: Buffer; // bytes after it until the server closed ("" if it did not)
  closed: boolean;
}

// exchange writes req on a new connection to host and reads one response;
// then, if the response says Connection: close, whatever follows until the
// server closes.
async function exchange(host: string, req: Buffer): Promise<Response> {
  const [h, p] = [host.slice(0, host.lastIndexOf(":")), Number(host.slice(host.lastIndexOf(":") + 1))];
  const sock: Socket = connect(p, h);
  sock.setTimeout(30_000, () => sock.destroy(new Error("no answer within 30 s")));
  let buf = Buffer.alloc(0);
  let closed = false;
  let wake: (() => void) | undefined;
  let failure: Error | undefined;
  sock.on("data", (d: Buffer) => ((buf = Buffer.concat([buf, d])), wake?.()));
  sock.on("end", () => ((closed = true), wake?.()));
  sock.on("error", (err) => ((failure = err), wake?.()));
  sock.on("close", () => ((closed = true), wake?.()));
  const more = async () => {
    if (failure) throw failure;
    if (closed) throw new Error(`connection closed mid-answer: ${JSON.stringify(buf.toString("latin1"))}`);
    return new Promise<void>((resolve) => (wake = resolve));
  };
  sock.write(req);
  try {
    let end: number;
    while ((end = buf.indexOf("\r\n\r\n")) < 0) await more();
    const [statusLine, ...lines] = buf.subarray(0, end).toString("latin1").split("\r\n");
    const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(statusLine!)?.[1]);
    const headers = new Map(lines.map((l) => [l.slice(0, l.indexOf(":")).trim().toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]));
    let pos = end + 4;
    let body = Buffer.alloc(0);
    if (headers.get("transfer-encoding") === "chunked") {
      for (;;) {
        let eol: number;
        while ((eol = buf.indexOf("\r\n", pos)) < 0) await more();
        const size = parseInt(buf.subarray(pos, eol).toString("latin1"), 16);
        while (buf.length < eol + 2 + size + 2) await more();
        body = Buffer.concat([body, buf.subarray(eol + 2, eol + 2 + size)]);
        pos = eol + 2 + size + 2;
        if (size === 0) break;
      }
    } else {
      const n = Number(headers.get("content-length") ?? 0);
      while (buf.length < pos + n) await more();
      body = buf.subarray(pos, pos + n);
      pos += n;
    }
    if (headers.get("connection")?.toLowerCase() === "close") {
      while (!closed && !failure) await more();
    }
    return { status, headers, body, rest: buf.subarray(pos), closed };
  } finally {
    sock.destroy();
  }
}

// checkJSONRPC checks the JSON-RPC answer in body (JSON, or the first
// event of an event stream) against c.
function checkJSONRPC(c: Case, contentType: string, body: Buffer): void {
  let text = body.toString("utf8");
  if (contentType.startsWith("text/event-stream")) {
    text = /^data:(.*)$/m.exec(text)?.[1]?.trim() ?? "";
  }
  const msg = JSON.parse(text) as { jsonrpc?: string; id?: unknown; result?: unknown; error?: { code?: number; message?: string } };
  assert.equal(msg.jsonrpc, "2.0", text);
  assert.deepEqual(msg.id, c.id, text);
  if (c.result) assert.ok(msg.result !== undefined && msg.error === undefined, `want a result: ${text}`);
  else assert.equal(msg.error?.code, c.error, `want an error with code ${c.error}: ${text}`);
  if (c.message !== undefined) assert.equal(msg.error?.message, c.message, text);
  if (c.id === undefined) assert.ok(!("id" in msg), `want no id: ${text}`);
}

test("golden http", async (t) => {
  const corpus = JSON.parse(readFileSync(join(GOLDEN_DIR, "http.json"), "utf8")) as { allowedOrigins: string; cases: Case[] };
  assert.ok(corpus.cases.length > 0, "http.json has no cases");
  let coorddCalls = 0;
  const getter = {
    addr: "coordd.test:1",
    get: () => {
      coorddCalls++;
      return Promise.reject(new Error("coordd must not be asked"));
    },
  };
  const mdn = new MDN(getter, "https://mdn.test");
  const server = await serveHTTP(
    { host: "127.0.0.1", port: 0, allowedOrigins: parseOrigins(corpus.allowedOrigins), log: () => {} },
    () => newServer(mdn),
  );
  const host = new URL(server.url).host;
  try {
    for (const c of corpus.cases) {
      await t.test(c.name, async () => {
        const res = await exchange(host, request(c, host));
        assert.equal(res.status, c.status, `status; body ${JSON.stringify(res.body.toString())}`);
        if (c.close) {
          assert.equal(res.headers.get("connection")?.toLowerCase(), "close", "Connection: close");
          assert.ok(res.closed, "connection closed");
          assert.equal(res.rest.toString("latin1"), "", "nothing after the answer");
        }
        if (c.result || c.error !== undefined) checkJSONRPC(c, res.headers.get("content-type") ?? "", res.body);
      });
    }
  } finally {
    assert.ok(await server.drain(), "drained");
  }
  // drain waited for every request handled: none may have reached coordd.
  assert.equal(coorddCalls, 0, "requests that reached coordd");
});

test("parseOrigins", () => {
  assert.deepEqual([...parseOrigins("")], []);
  assert.deepEqual([...parseOrigins(" https://app.example , http://localhost:3000")], ["https://app.example", "http://localhost:3000"]);
  assert.deepEqual([...parseOrigins("HTTPS://App.Example:443,http://x.example:80,https://y.example:80")], [
    "https://app.example",
    "http://x.example",
    "https://y.example:80",
  ]);
  assert.deepEqual([...parseOrigins("http://[::1]:8080")], ["http://[::1]:8080"]);
  for (const bad of ["https://app.example/", "app.example", "null", "*", "https://u@app.example", "file://x"]) {
    assert.throws(() => parseOrigins(bad), /--allowed-origins/, bad);
  }
});
