// Integration tests: the client and the MCP server against a real coordd
// (built from this repository) in front of a fake MDN.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";

import { BodyTooLargeError, Code, ConnectError, CoorddClient, Role, Source, UnreachableError } from "../client.js";
import { MAP_PATH, mapPage, searchResults } from "./fixtures.js";
import { freePort, SERVER_JS, startCoordd, startFakeMDN, type Coordd, type FakeMDN } from "./harness.js";

// BODY_SIZES are bodies around the server's 64 KiB chunks.
const BODY_SIZES = [0, 1, 64 << 10, (64 << 10) + 1, 1 << 20];

// LIMIT is the maxBodyBytes tested, with bodies of LIMIT_SIZES at
// /limited/<size>.
const LIMIT = 64 << 10;
const LIMIT_SIZES = [LIMIT, LIMIT + 1, 1 << 20];

/** sizedBody returns n bytes that differ from one offset to the next. */
function sizedBody(n: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + (i >> 8)) & 0xff;
  return b;
}

let mdn: FakeMDN;
let coordd: Coordd;

before(async () => {
  mdn = await startFakeMDN({
    pages: {
      [MAP_PATH]: mapPage,
      "/en-US/docs/Client/Page": mapPage,
      "/en-US/docs/Crowd/Page": mapPage,
    },
    search: searchResults,
    raw: Object.fromEntries([
      ...BODY_SIZES.map((n) => [`/sized/${n}`, sizedBody(n)]),
      ...LIMIT_SIZES.map((n) => [`/limited/${n}`, sizedBody(n)]),
    ]),
    delayMs: 200, // long enough for concurrent calls to overlap
  });
  coordd = await startCoordd({ mdn: mdn.base });
});

after(async () => {
  await coordd?.stop();
  await mdn?.close();
});

async function rejectsWithCode(p: Promise<unknown>, code: Code): Promise<ConnectError> {
  const err = await p.then(
    () => assert.fail(`resolved; want ${Code[code]}`),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ConnectError, `got ${String(err)}; want a ConnectError`);
  assert.equal(Code[err.code], Code[code], err.message);
  return err;
}

describe("CoorddClient.get", () => {
  let client: CoorddClient;
  before(() => {
    client = new CoorddClient(coordd.addr);
  });
  after(() => client.close());

  test("returns the body and metadata, then hits the cache", async () => {
    const url = `${mdn.base}/en-US/docs/Client/Page/index.json`;
    const seen: Role[] = [];
    const doc = await client.get(url, { onProgress: (p) => seen.push(p.role) });
    assert.deepEqual(JSON.parse(doc.text()), mapPage);
    assert.equal(doc.body.length, Number(doc.metadata.size));
    assert.equal(doc.metadata.statusCode, 200);
    assert.equal(doc.metadata.upstream, "mdn");
    assert.equal(doc.metadata.source, Source.UPSTREAM);
    assert.match(doc.metadata.contentType, /^application\/json/);
    assert.deepEqual(seen, doc.progress.map((p) => p.role));
    assert.ok(doc.progress.some((p) => p.role === Role.LEADER), "no LEADER progress");

    const again = await client.get(url);
    assert.equal(again.metadata.source, Source.L1);
    assert.ok(again.progress.every((p) => p.role === Role.HIT), "a cache hit reported another role");
    assert.deepEqual(again.body, doc.body);
    assert.equal(mdn.requests("/en-US/docs/Client/Page/index.json"), 1);

    // maxAgeMs refuses the cached copy once it is older than that.
    await new Promise((resolve) => setTimeout(resolve, 10));
    const newer = await client.get(url, { maxAgeMs: 1 });
    assert.equal(newer.metadata.source, Source.UPSTREAM);
    assert.equal(mdn.requests("/en-US/docs/Client/Page/index.json"), 2);
  });

  test("bodies of every size round-trip, from the upstream and from the cache", async (t) => {
    for (const n of BODY_SIZES) {
      await t.test(`${n} bytes`, async () => {
        for (const want of [Source.UPSTREAM, Source.L1]) {
          const doc = await client.get(`${mdn.base}/sized/${n}`);
          assert.equal(doc.metadata.source, want);
          assert.equal(doc.metadata.size, BigInt(n));
          assert.ok(Buffer.from(doc.body).equals(Buffer.from(sizedBody(n))), `body of ${doc.body.length} bytes differs`);
        }
      });
    }
  });

  test("maxBodyBytes admits a body of that size and refuses a larger one", async () => {
    const limited = new CoorddClient(coordd.addr, { maxBodyBytes: LIMIT });
    try {
      const doc = await limited.get(`${mdn.base}/limited/${LIMIT}`);
      assert.ok(Buffer.from(doc.body).equals(Buffer.from(sizedBody(LIMIT))), `body of ${doc.body.length} bytes differs`);
      const err = await rejectsWithCode(limited.get(`${mdn.base}/limited/${LIMIT + 1}`), Code.FailedPrecondition);
      assert.ok(err instanceof BodyTooLargeError, String(err));
      assert.match(err.message, new RegExp(`${LIMIT + 1} bytes; the limit is ${LIMIT}`));
    } finally {
      limited.close();
    }
    // The default is no limit.
    for (const n of [LIMIT + 1, 1 << 20]) {
      const doc = await client.get(`${mdn.base}/limited/${n}`);
      assert.equal(doc.body.length, n);
    }
  });

  test("a 404 is a document, not an error", async () => {
    const doc = await client.get(`${mdn.base}/en-US/docs/Client/Missing/index.json`);
    assert.equal(doc.metadata.statusCode, 404);
  });

  test("a URL outside every upstream gives PermissionDenied", async () => {
    await rejectsWithCode(client.get("http://127.0.0.1:1/elsewhere"), Code.PermissionDenied);
  });

  test("an empty URL gives InvalidArgument", async () => {
    await rejectsWithCode(client.get(""), Code.InvalidArgument);
  });

  test("a coordd that dies mid-call gives UnreachableError (Unavailable)", async () => {
    const doomed = await startCoordd({ mdn: mdn.base });
    const c = new CoorddClient(doomed.addr, { retry: { attempts: 1 } });
    try {
      // The fake MDN holds its answer back, so the kill lands between the
      // leader's progress event and the metadata.
      const got = c.get(`${mdn.base}/en-US/docs/Client/Doomed/index.json`, { onProgress: () => doomed.kill() });
      const err = await rejectsWithCode(got, Code.Unavailable);
      assert.ok(err instanceof UnreachableError, err.message);
    } finally {
      c.close();
      await doomed.stop();
    }
  });

  test("an unreachable coordd gives UnreachableError (Unavailable)", async () => {
    const down = new CoorddClient(`127.0.0.1:${await freePort()}`, { retry: { attempts: 3, baseDelayMs: 10 } });
    try {
      const err = await rejectsWithCode(down.get(`${mdn.base}/x`), Code.Unavailable);
      assert.ok(err instanceof UnreachableError, err.message);
    } finally {
      down.close();
    }
  });
});

/** mcpClient starts the built MCP server over stdio and connects to it. */
async function mcpClient(coorddAddr: string): Promise<Client> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [SERVER_JS, "--coordd", coorddAddr, "--mdn-base", mdn.base],
    stderr: "pipe",
  });
  const client = new Client({ name: "coordd-ts-test", version: "0.0.0" });
  await client.connect(transport);
  return client;
}

function text(r: CallToolResult): string {
  return r.content.map((c) => (c.type === "text" ? c.text : "")).join("");
}

async function call(c: Client, name: string, args: Record<string, unknown>): Promise<CallToolResult> {
  return (await c.callTool({ name, arguments: args })) as CallToolResult;
}

describe("MCP server", () => {
  let clients: Client[] = [];
  before(async () => {
    clients = await Promise.all([mcpClient(coordd.addr), mcpClient(coordd.addr)]);
  });
  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
  });

  test("lists mdn_doc and mdn_search", async () => {
    const { tools } = await clients[0]!.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), ["mdn_doc", "mdn_search"]);
  });

  test("20 concurrent mdn_doc calls make one upstream request", async () => {
    const path = "/en-US/docs/Crowd/Page";
    // 10 calls through each of two server processes, all at once.
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => call(clients[i % 2]!, "mdn_doc", { path })),
    );
    for (const r of results) {
      assert.ok(!r.isError, text(r));
      assert.match(text(r), /^# Array\.prototype\.map\(\)\n/);
      assert.match(text(r), /## Syntax\n\n```js\nmap\(callbackFn\)/);
    }
    assert.equal(mdn.requests(`${path}/index.json`), 1);
  });

  test("mdn_doc renders the page", async () => {
    const r = await call(clients[0]!, "mdn_doc", { path: MAP_PATH });
    assert.ok(!r.isError, text(r));
    assert.ok(text(r).includes("The **`map()`** method of [`Array`]"), text(r));
  });

  test("mdn_search returns the top 10 with paths", async () => {
    const r = await call(clients[0]!, "mdn_search", { query: "array map" });
    assert.ok(!r.isError, text(r));
    assert.match(text(r), /^10\. Result 10\n {3}path: \/en-US\/docs\/Result\/10$/m);
    assert.doesNotMatch(text(r), /Result 11/);
    assert.equal(mdn.requests("/api/v1/search"), 1);
  });

  test("a missing page is a tool error", async () => {
    const r = await call(clients[0]!, "mdn_doc", { path: "/en-US/docs/Nope" });
    assert.equal(r.isError, true);
    assert.match(text(r), /^page \/en-US\/docs\/Nope not found on MDN \(HTTP 404\); use mdn_search/);
  });

  test("a bad path is a tool error and reaches no upstream", async () => {
    for (const path of ["en-US/docs/Web", "/en-US/docs/../../secret"]) {
      const r = await call(clients[0]!, "mdn_doc", { path });
      assert.equal(r.isError, true, path);
      assert.match(text(r), /^path ".*" must/);
    }
    assert.equal(mdn.requests("/secret/index.json"), 0);
  });

  test("an unreachable coordd is a tool error", async () => {
    const c = await mcpClient(`127.0.0.1:${await freePort()}`);
    try {
      const r = await call(c, "mdn_doc", { path: MAP_PATH });
      assert.equal(r.isError, true);
      assert.match(text(r), /^cannot get page .*: coordd at 127\.0\.0\.1:\d+ is unreachable \(connect ECONNREFUSED/);
      // The server is still up.
      assert.equal((await call(c, "mdn_search", { query: "x" })).isError, true);
    } finally {
      await c.close();
    }
  });
});
