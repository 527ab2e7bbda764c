// The corpus both MCP servers are tested against, byte for byte
// (testdata/mcp-golden; the Go server's TestGolden reads the same files):
// pages/NAME.json renders as pages/NAME.md, search/Q.json as search/Q.md
// for the query Q ("_" for spaces), with https://developer.mozilla.org as
// MDN's base.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import type { CallToolResult, JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";

import { Code, ConnectError, MetadataSchema, type Document } from "../client.js";
import { MDN, renderDoc, renderSearch, type Getter } from "../mcp/mdn.js";
import { newServer } from "../mcp/tools.js";
import { REPO_ROOT } from "./harness.js";

export const GOLDEN_DIR = join(REPO_ROOT, "testdata", "mcp-golden");
const BASE = new URL("https://developer.mozilla.org");

for (const kind of ["pages", "search"] as const) {
  test(`golden ${kind}`, async (t) => {
    const inputs = readdirSync(join(GOLDEN_DIR, kind)).filter((f) => f.endsWith(".json"));
    assert.ok(inputs.length > 0, `no ${kind} in ${GOLDEN_DIR}`);
    for (const file of inputs) {
      const name = file.slice(0, -".json".length);
      await t.test(name, () => {
        const input = JSON.parse(readFileSync(join(GOLDEN_DIR, kind, file), "utf8"));
        const want = readFileSync(join(GOLDEN_DIR, kind, `${name}.md`), "utf8");
        const got = kind === "pages" ? renderDoc(input.doc, BASE) : renderSearch(name.replaceAll("_", " "), input, BASE);
        assert.equal(got, want);
      });
    }
  });
}

/** Case is one case of errors.json. */
interface Case {
  name: string;
  tool: string;
  arguments: Record<string, unknown>;
  coordd?: { status?: number; body?: string; code?: string; message?: string; retryDelaySeconds?: number };
  text?: string;
  textPrefix?: string;
  retryAfterSeconds?: number;
}

// stub answers as a case's coordd says, and counts calls.
function stub(answer: Case["coordd"]): Getter & { calls: number } {
  const g = {
    addr: "coordd.test:1",
    calls: 0,
    async get(): Promise<Document> {
      g.calls++;
      if (!answer) throw new Error("coordd must not be asked");
      if (answer.code) {
        const code = {
          UNAVAILABLE: Code.Unavailable, RESOURCE_EXHAUSTED: Code.ResourceExhausted, PERMISSION_DENIED: Code.PermissionDenied,
          UNAUTHENTICATED: Code.Unauthenticated, DEADLINE_EXCEEDED: Code.DeadlineExceeded, INTERNAL: Code.Internal,
        }[answer.code];
        assert.ok(code !== undefined, `unknown code ${answer.code}`);
        const err = new ConnectError(answer.message ?? "", code);
        if (answer.retryDelaySeconds) {
          // google.rpc.RetryInfo { retry_delay: Duration { seconds, nanos } }, as coordd sends it.
          const s = Math.floor(answer.retryDelaySeconds);
          const nanos = Math.round((answer.retryDelaySeconds - s) * 1e9);
          const w = new BinaryWriter();
          w.tag(1, WireType.LengthDelimited).fork().tag(1, WireType.Varint).int64(s).tag(2, WireType.Varint).int32(nanos).join();
          err.details.push({ type: "google.rpc.RetryInfo", value: w.finish() });
        }
        throw err;
      }
      const text = answer.body ?? "";
      const body = new TextEncoder().encode(text);
      return {
        body,
        metadata: create(MetadataSchema, { statusCode: answer.status ?? 200, size: BigInt(body.length) }),
        progress: [],
        text: () => text,
      };
    },
  };
  return g;
}

async function connect(getter: Getter): Promise<Client> {
  const [ct, st] = InMemoryTransport.createLinkedPair();
  await newServer(new MDN(getter, "https://mdn.test")).connect(st);
  const client = new Client({ name: "golden", version: "0" });
  await client.connect(ct);
  return client;
}

test("golden errors", async (t) => {
  const { cases } = JSON.parse(readFileSync(join(GOLDEN_DIR, "errors.json"), "utf8")) as { cases: Case[] };
  for (const c of cases) {
    await t.test(c.name, async () => {
      const g = stub(c.coordd);
      const client = await connect(g);
      try {
        const res = (await client.callTool({ name: c.tool, arguments: c.arguments })) as CallToolResult;
        const text = res.content.map((x) => (x.type === "text" ? x.text : "")).join("");
        assert.equal(res.isError, true, `isError; text ${JSON.stringify(text)}`);
        if (c.text !== undefined) assert.equal(text, c.text);
        if (c.textPrefix !== undefined) assert.ok(text.startsWith(c.textPrefix), `${JSON.stringify(text)} does not start with ${JSON.stringify(c.textPrefix)}`);
        assert.deepEqual(res.structuredContent?.["retryAfterSeconds"], c.retryAfterSeconds);
        if (!c.coordd) assert.equal(g.calls, 0, "coordd asked");
      } finally {
        await client.close();
      }
    });
  }
});

// listToolsRaw opens a session at version with newServer over an
// in-memory transport, sends tools/list and returns its result as the wire
// carries it: JSON, as the stdio and HTTP transports serialize it.
async function listToolsRaw(version: string): Promise<unknown> {
  const [ct, st] = InMemoryTransport.createLinkedPair();
  await newServer(new MDN(stub(undefined), "https://mdn.test")).connect(st);
  const answers = new Map<unknown, (m: JSONRPCMessage) => void>();
  ct.onmessage = (m) => {
    if ("id" in m) answers.get(m.id)?.(JSON.parse(JSON.stringify(m)) as JSONRPCMessage);
  };
  await ct.start();
  const call = (id: number, method: string, params?: Record<string, unknown>) =>
    new Promise<unknown>((resolve, reject) => {
      answers.set(id, (m) => ("result" in m ? resolve(m.result) : reject(new Error(`${method}: ${JSON.stringify(m)}`))));
      void ct.send({ jsonrpc: "2.0", id, method, ...(params ? { params } : {}) });
    });
  try {
    const init = (await call(1, "initialize", { protocolVersion: version, capabilities: {}, clientInfo: { name: "golden", version: "0" } })) as {
      protocolVersion: string;
    };
    assert.equal(init.protocolVersion, version);
    await ct.send({ jsonrpc: "2.0", method: "notifications/initialized" });
    return await call(2, "tools/list");
  } finally {
    await ct.close();
  }
}

// tools.json: tools/list's whole result, as the Go server's TestGoldenTools
// checks it too; no $schema (2020-12, the default dialect), no execution.
test("golden tools", async () => {
  const corpus = JSON.parse(readFileSync(join(GOLDEN_DIR, "tools.json"), "utf8")) as { protocolVersion: string; result: unknown };
  assert.deepEqual(await listToolsRaw(corpus.protocolVersion), corpus.result);
});
