// coordd's one rendering of an answer as HTTP (docs/api.md, "One
// rendering"): the fetch drop-in answers every case of
// testdata/http-rendering, read from the same file as the HTTP door's and
// the Go and Python drop-ins' tests, through a stub coordd that sends the
// case's metadata or error as coordd does.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { fromJson } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";

import { Code, ConnectError, CoorddClient, createFetch, MetadataSchema, NotCarriedError, type FetchFunction } from "../index.js";
import { REPO_ROOT } from "./harness.js";
import { failure, metadata, startStub, type Script, type Stub } from "./stubcoordd.js";

interface DocumentCase { name: string; metadata: unknown; status: number; headers?: Record<string, string[]>; absent?: string[] }
interface ErrorCase {
  name: string; code: string; message: string; reason?: string; domain?: string; retry_delay?: string;
  status: number; drop_in: "response" | "not_carried" | "error"; headers?: Record<string, string[]>; absent?: string[]; body: unknown;
}
const cases = JSON.parse(readFileSync(join(REPO_ROOT, "testdata", "http-rendering", "cases.json"), "utf8")) as { documents: DocumentCase[]; errors: ErrorCase[] };

// codeOf is the Code named as in google.rpc.Code (RESOURCE_EXHAUSTED).
function codeOf(name: string): Code {
  for (const [k, v] of Object.entries(Code)) {
    if (typeof v === "number" && k.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase() === name) return v;
  }
  throw new Error(`code ${name}`);
}

// errorOf is the case's status as coordd sends it: a RetryInfo and an ErrorInfo detail.
function errorOf(c: ErrorCase): ConnectError {
  const delay = c.retry_delay === undefined ? undefined : Number(c.retry_delay.replace(/s$/, "")) * 1000;
  const err = failure(codeOf(c.code), c.message, delay);
  if (c.reason !== undefined) {
    const info = new BinaryWriter().uint32(10).string(c.reason).uint32(18).string(c.domain ?? "coordd").finish();
    err.details.push({ type: "google.rpc.ErrorInfo", value: info });
  }
  return err;
}

function checkHeaders(name: string, h: Headers, want: Record<string, string[]> = {}, absent: string[] = []) {
  for (const [k, v] of Object.entries(want)) assert.equal(h.get(k), v.join(", "), `${name}: ${k}`);
  for (const k of absent) assert.equal(h.get(k), null, `${name}: ${k} must be absent`);
}

let stub: Stub;
let client: CoorddClient;
let fetch: FetchFunction;
let viaFallback: FetchFunction;
const fallbackCalls: string[] = [];

before(async () => {
  const scripts: Record<string, Script> = {};
  cases.documents.forEach((d, i) => {
    const md = fromJson(MetadataSchema, d.metadata as never);
    scripts[`/doc/${i}`] = async function* () {
      yield metadata(md);
    };
  });
  cases.errors.forEach((e, i) => {
    scripts[`/err/${i}`] = async function* () {
      throw errorOf(e);
    };
  });
  stub = await startStub(scripts);
  client = new CoorddClient(stub.addr, { retry: { attempts: 1 }, timeoutMs: 10_000 });
  fetch = createFetch(client);
  viaFallback = createFetch(client, {
    fallback: async (input) => {
      fallbackCalls.push(String(input));
      return new Response("from the fallback", { status: 418 });
    },
  });
});

after(async () => {
  client.close();
  await stub.close();
});

test("documents are rendered as the corpus says", async () => {
  for (const [i, d] of cases.documents.entries()) {
    const res = await fetch(`https://developer.mozilla.org/doc/${i}`, { method: "HEAD" });
    assert.equal(res.status, d.status, d.name);
    checkHeaders(d.name, res.headers, d.headers, d.absent);
  }
});

test("errors are rendered, refused or not carried as the corpus says, by reason alone", async () => {
  for (const [i, e] of cases.errors.entries()) {
    const url = `https://developer.mozilla.org/err/${i}`;
    switch (e.drop_in) {
      case "response": {
        const res = await fetch(url);
        assert.equal(res.status, e.status, e.name);
        checkHeaders(e.name, res.headers, e.headers, e.absent);
        assert.deepEqual(await res.json(), e.body, e.name);
        break;
      }
      case "not_carried": {
        await assert.rejects(fetch(url), NotCarriedError, e.name);
        const before = fallbackCalls.length;
        const res = await viaFallback(url);
        assert.equal(res.status, 418, `${e.name}: the fallback's answer`);
        assert.equal(fallbackCalls.length, before + 1, e.name);
        break;
      }
      case "error": {
        const before = fallbackCalls.length;
        await assert.rejects(viaFallback(url), (err: unknown) => err instanceof TypeError && !(err instanceof NotCarriedError), e.name);
        assert.equal(fallbackCalls.length, before, `${e.name}: never the fallback's`);
        break;
      }
    }
  }
});
