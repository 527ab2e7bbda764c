// The client conformance corpus (testdata/client-conformance; the Go and
// Python clients play the same cases): CoorddClient.get against the
// scripted fake coordd of internal/testing/clientconformance, started as a child
// process. A case or field this runner does not know fails it.

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";

import { BodyTooLargeError, Code, ConnectError, CoorddClient, Priority, Stage, type CallPriority } from "../client.js";
import { goBuild, REPO_ROOT } from "./harness.js";

const CORPUS_DIR = join(REPO_ROOT, "testdata", "client-conformance");

interface ClientConfig {
  max_attempts: number;
  initial_backoff_ms: number;
  max_backoff_ms: number;
  timeout_ms: number;
  max_body_bytes: number;
}

interface WantDocument {
  body: string;
  status_code: number;
  content_type: string;
  etag: string;
  progress: string[];
}

interface Case {
  name: string;
  about: string;
  client: ClientConfig;
  call?: { priority?: CallPriority };
  attempts: unknown[][];
  want: { document?: WantDocument; error?: string; attempts: number; min_gaps_ms?: number[]; priority?: string };
}

interface FakeRecord {
  attempts: number;
  gaps_ms: number[];
  priorities: string[];
  problems: string[];
}

// keys fails unless every key of obj is one of known.
function keys(obj: unknown, known: string[], where: string): Record<string, unknown> & object {
  assert.ok(obj !== null && typeof obj === "object" && !Array.isArray(obj), `${where}: not an object`);
  for (const k of Object.keys(obj)) assert.ok(known.includes(k), `${where}: unknown field ${JSON.stringify(k)}`);
  return obj as Record<string, unknown> & object;
}

const CLIENT_KEYS = ["max_attempts", "initial_backoff_ms", "max_backoff_ms", "timeout_ms", "max_body_bytes"];
const STEP_KEYS = ["progress", "metadata", "chunk", "unknown_event", "status", "cut"];

// load reads cases.json and checks every field this runner reads or the
// fake plays (the fake checks the steps' contents).
function load(): Case[] {
  const file = keys(JSON.parse(readFileSync(join(CORPUS_DIR, "cases.json"), "utf8")), ["comment", "client", "cases"], "cases.json");
  const defaults = keys(file["client"], CLIENT_KEYS, "client") as unknown as ClientConfig;
  const cases = file["cases"];
  assert.ok(Array.isArray(cases) && cases.length > 0, "cases.json has no cases");
  return cases.map((raw: unknown, i: number) => {
    const c = keys(raw, ["name", "about", "client", "call", "attempts", "want"], `case ${i}`) as unknown as Case;
    const where = `case ${c.name}`;
    c.client = { ...defaults, ...(keys(c.client ?? {}, CLIENT_KEYS, `${where}: client`) as unknown as Partial<ClientConfig>) };
    for (const a of c.attempts) for (const s of a) assert.equal(Object.keys(keys(s, STEP_KEYS, `${where}: step`)).length, 1, `${where}: a step does one thing`);
    const call = keys(c.call ?? {}, ["priority"], `${where}: call`);
    assert.ok([undefined, "interactive", "background"].includes(call["priority"] as string | undefined), `${where}: call.priority`);
    const w = keys(c.want, ["document", "error", "attempts", "min_gaps_ms", "priority"], `${where}: want`);
    assert.ok(wantPriority(c).replace(/^PRIORITY_/, "") in Priority, `${where}: unknown want.priority ${wantPriority(c)}`);
    assert.ok((w["document"] === undefined) !== (w["error"] === undefined), `${where}: want document or error`);
    if (c.want.document) {
      keys(c.want.document, ["body", "status_code", "content_type", "etag", "progress"], `${where}: want.document`);
      for (const p of c.want.document.progress ?? []) assert.ok(stageName(p) in Stage, `${where}: unknown stage ${p}`);
    }
    if (c.want.error) expectedError(c.want.error); // throws on a name it does not know
    return c;
  });
}

// wantPriority is the priority, by name, every attempt of c must carry.
function wantPriority(c: Case): string {
  return c.want.priority ?? "PRIORITY_UNSPECIFIED";
}

// stageName is a coordd.v1.Stage name as protobuf-es spells it (no STAGE_ prefix).
function stageName(s: string): string {
  return s.replace(/^STAGE_/, "");
}

// expectedError is a check of an error against a want.error name.
function expectedError(name: string): (err: unknown) => void {
  if (name === "bad_stream") {
    return (err) => {
      assert.ok(err instanceof ConnectError, String(err));
      assert.equal(Code[err.code], Code[Code.Internal]);
      assert.match(err.message, /malformed GetOrFetch stream/);
    };
  }
  if (name === "body_too_large") {
    return (err) => assert.ok(err instanceof BodyTooLargeError, String(err));
  }
  // RESOURCE_EXHAUSTED → ResourceExhausted; CANCELLED → Canceled.
  const camel = name === "CANCELLED" ? "Canceled" : name.toLowerCase().replace(/(^|_)([a-z])/g, (_, __, ch: string) => ch.toUpperCase());
  const code = (Code as unknown as { [k: string]: Code | undefined })[camel];
  assert.ok(typeof code === "number" && code !== (0 as Code), `want.error ${JSON.stringify(name)}: not a gRPC code name, bad_stream or body_too_large`);
  return (err) => {
    assert.ok(err instanceof ConnectError, String(err));
    assert.equal(Code[err.code], Code[code], err.message);
  };
}

let fake: ChildProcess | undefined;
let addr = "";
let control = "";

before(async () => {
  const bin = await goBuild("./internal/testing/clientconformance/fakecoordd");
  fake = spawn(bin, ["--corpus", CORPUS_DIR], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: fake.stdout! });
  const first = await new Promise<string>((resolve, reject) => {
    lines.once("line", resolve);
    fake!.once("exit", (code) => reject(new Error(`fakecoordd exited with status ${code}`)));
  });
  lines.close();
  const got = JSON.parse(first) as { addr: string; control: string };
  addr = got.addr;
  control = got.control;
});

after(() => {
  fake?.stdin?.end(); // it stops when its input ends
});

const cases = load();

test("client conformance corpus", { timeout: 120_000 }, async (t) => {
  let ran = 0;
  for (const c of cases) {
    await t.test(c.name, async () => {
      ran++;
      await play(c);
    });
  }
  assert.equal(ran, cases.length, "cases run");
});

async function play(c: Case): Promise<void> {
  const cc = c.client;
  const client = new CoorddClient(addr, {
    retry: { attempts: cc.max_attempts, baseDelayMs: cc.initial_backoff_ms, maxDelayMs: cc.max_backoff_ms },
    timeoutMs: cc.timeout_ms,
    maxBodyBytes: cc.max_body_bytes,
  });
  const url = `http://conformance.test/${c.name}/ts`;
  try {
    const got = await client.get(url, { priority: c.call?.priority }).then(
      (doc) => ({ doc }),
      (err: unknown) => ({ err }),
    );
    const want = c.want;
    if (want.document) {
      assert.ok("doc" in got, `get failed: ${"err" in got ? String(got.err) : ""}`);
      const { doc } = got;
      const wd = want.document;
      assert.deepEqual(
        {
          body: doc.text(),
          status_code: doc.metadata.statusCode,
          content_type: doc.metadata.contentType,
          etag: doc.metadata.etag,
          progress: doc.progress.map((p) => `STAGE_${Stage[p.stage]}`),
        },
        { ...wd, progress: wd.progress ?? [] },
      );
    } else {
      assert.ok("err" in got, "get resolved; want an error");
      expectedError(want.error!)(got.err);
    }

    const res = await fetch(`${control}?url=${encodeURIComponent(url)}`);
    const rec = (await res.json()) as FakeRecord;
    assert.deepEqual(rec.problems, [], "the fake could not play the calls");
    assert.equal(rec.attempts, want.attempts, "attempts");
    assert.deepEqual(rec.priorities, Array(rec.attempts).fill(wantPriority(c)), "each attempt's priority");
    (want.min_gaps_ms ?? []).forEach((least, i) => {
      const gap = rec.gaps_ms[i] ?? Infinity;
      assert.ok(gap >= least, `wait before attempt ${i + 2} = ${gap.toFixed(1)} ms; want at least ${least} ms`);
    });
  } finally {
    client.close();
  }
}
