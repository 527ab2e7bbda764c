// The fetch drop-in under a library written elsewhere: @octokit/rest,
// unmodified, calling the global fetch, against three real coordd
// instances sharing one redis-server, in front of the fake GitHub-like API
// (internal/testing/fakeapi). Three worker processes (octokitworker.ts), each on
// its own instance, make 30 concurrent identical calls each; the rest runs
// in this process with globalThis.fetch replaced.

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface, type Interface } from "node:readline";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Octokit } from "@octokit/rest";

import { CoorddClient, createFetch, NotCarriedError, UnreachableError, type FetchFunction } from "../index.js";
import { freePort, startCoordd, startFakeAPI, startRedis, type Coordd, type FakeAPI, type Redis } from "./harness.js";
import type { Job, Result } from "./octokitworker.js";

const WORKER_JS = fileURLToPath(new URL("./octokitworker.js", import.meta.url));

const TOKENS: Record<string, string> = {
  alice: "tok-alice",
  bob: "tok-bob",
  carol: "tok-carol",
  dave: "tok-dave",
  erin: "tok-erin",
  frank: "tok-frank",
  grace: "tok-grace",
  bot: "tok-bot", // coordd's own credential
};
const INSTANCES = 3;
const CALLS = 30;

let api: FakeAPI;
let redis: Redis;
const coordds: Coordd[] = [];
let client: CoorddClient; // on coordds[0], for this process
let downBase = "";
const realFetch = globalThis.fetch;

before(async () => {
  [api, redis] = await Promise.all([startFakeAPI({ tokens: TOKENS, delayMs: 300 }), startRedis()]);
  downBase = `http://127.0.0.1:${await freePort()}`; // nothing listens there
  const config = `credential_scope_key_env: COORDD_SCOPE_KEY
upstreams:
  - name: github
    base_url: "${api.base}/"
    credential: {header: Authorization, value_env: GITHUB_TOKEN}
    request_headers: {User-Agent: "coordd"}
    forward_headers: [Accept]
    caller_credentials: true
  - name: down
    base_url: "${downBase}/"
    caller_credentials: true
    retry: {max_attempts: 1}
`;
  const env = { COORDD_SCOPE_KEY: "scope-key-0123456789abcdef", GITHUB_TOKEN: `Bearer ${TOKENS["bot"]}` };
  // One at a time: three Go processes starting at once on two cores make
  // the 20 s start budget tight, and nothing is gained.
  for (let i = 0; i < INSTANCES; i++) coordds.push(await startCoordd({}, { config, env, redis: redis.url }));
  client = new CoorddClient(coordds[0]!.addr);
  globalThis.fetch = createFetch(client);
});

after(async () => {
  globalThis.fetch = realFetch;
  client?.close();
  await Promise.all(coordds.map((c) => c.stop()));
  await Promise.all([api?.close(), redis?.stop()]);
});

/** Worker is an octokitworker.ts process on one coordd instance. */
interface Worker {
  proc: ChildProcess;
  lines: Interface;
  next(): Promise<string>;
  stderr(): string;
}

function startWorker(coordd: Coordd): Worker {
  const proc = spawn(process.execPath, [WORKER_JS], {
    stdio: ["pipe", "pipe", "pipe"],
    env: { ...process.env, COORDD_ADDR: coordd.addr, API_BASE: api.base },
  });
  let log = "";
  proc.stderr!.setEncoding("utf8").on("data", (s: string) => (log += s));
  const lines = createInterface({ input: proc.stdout! });
  const queue: string[] = [];
  const waiting: ((l: string) => void)[] = [];
  lines.on("line", (l) => (waiting.length ? waiting.shift()!(l) : queue.push(l)));
  const next = () =>
    new Promise<string>((resolve, reject) => {
      if (queue.length) return resolve(queue.shift()!);
      waiting.push(resolve);
      proc.once("exit", (code) => reject(new Error(`worker exited with status ${code}\n${log}`)));
    });
  return { proc, lines, next, stderr: () => log };
}

// runWorkers starts a worker per instance, waits until all are loaded,
// then hands each the same job at once, and returns every result.
async function runWorkers(job: Job): Promise<Result[][]> {
  const workers = coordds.map(startWorker);
  try {
    for (const w of workers) assert.equal(await w.next(), "ready", w.stderr());
    for (const w of workers) w.proc.stdin!.write(`${JSON.stringify(job)}\n`);
    return await Promise.all(workers.map(async (w) => JSON.parse(await w.next()) as Result[]));
  } finally {
    for (const w of workers) w.proc.stdin!.end();
    await Promise.all(workers.map((w) => (w.proc.exitCode === null ? new Promise((r) => w.proc.once("exit", r)) : undefined)));
  }
}

function loginOf(token: string): string {
  const e = Object.entries(TOKENS).find(([, t]) => t === token);
  assert.ok(e, `unknown token ${token}`);
  return e[0];
}

// checkResults: every call succeeded and saw its own credential's answer.
function checkResults(results: Result[][], t: { diagnostic(msg: string): void }): void {
  const sources = new Map<string, number>();
  for (const [i, rs] of results.entries()) {
    assert.equal(rs.length, CALLS, `worker ${i}`);
    for (const r of rs) {
      assert.equal(r.error, undefined, `worker ${i}: ${r.error}`);
      assert.equal(r.status, 200);
      assert.equal(r.login, loginOf(r.token), `a caller with ${loginOf(r.token)}'s token got ${r.login}'s answer`);
      assert.equal(r.viewer, loginOf(r.token), `a caller with ${loginOf(r.token)}'s token got ${r.viewer}'s answer`);
      sources.set(`${i}:${r.source}`, (sources.get(`${i}:${r.source}`) ?? 0) + 1);
    }
  }
  t.diagnostic(`worker:x-coordd-source → calls: ${JSON.stringify(Object.fromEntries(sources))}`);
}

describe(`${INSTANCES} processes × ${CALLS} concurrent users.getAuthenticated(), one coordd instance each`, { timeout: 120_000 }, () => {
  test("one credential: one upstream request", async (t) => {
    const results = await runWorkers({ tokens: [TOKENS["alice"]!], calls: CALLS });
    checkResults(results, t);
    assert.equal(await api.requests("/user", "alice"), 1);
  });

  test("two credentials: two upstream requests, and no caller sees the other's answer", async (t) => {
    const results = await runWorkers({ tokens: [TOKENS["bob"]!, TOKENS["carol"]!], calls: CALLS });
    checkResults(results, t);
    assert.equal(await api.requests("/user", "bob"), 1);
    assert.equal(await api.requests("/user", "carol"), 1);
  });
});

describe("in this process, globalThis.fetch = createFetch(client)", { timeout: 120_000 }, () => {
  const octokit = (token: string | undefined, baseUrl = api.base) => new Octokit({ baseUrl, ...(token ? { auth: token } : {}) });

  test("octokit.paginate follows Link through every page, each fetched once", async () => {
    const o = octokit(TOKENS["dave"]);
    for (let round = 0; round < 2; round++) {
      const issues = await o.paginate(o.rest.issues.listForRepo, { owner: "octo", repo: "cat", per_page: 20 });
      assert.deepEqual(
        issues.map((i) => i.number),
        Array.from({ length: 75 }, (_, n) => n + 1),
      );
      assert.ok(
        issues.every((i) => (i as unknown as { viewer: string }).viewer === "dave"),
        "an issue answered for another login",
      );
    }
    const pages = (await api.stats()).filter((h) => h.login === "dave" && h.path.startsWith("/repos/octo/cat/issues"));
    assert.deepEqual(pages.map((h) => h.path).sort(), [
      "/repos/octo/cat/issues?page=2&per_page=20",
      "/repos/octo/cat/issues?page=3&per_page=20",
      "/repos/octo/cat/issues?page=4&per_page=20",
      "/repos/octo/cat/issues?per_page=20",
    ]);
    assert.ok(
      pages.every((h) => h.count === 1),
      `a page fetched more than once (the second round is coordd's cache): ${JSON.stringify(pages)}`,
    );
  });

  test("a 404 is octokit's RequestError with status 404", async () => {
    const err = await octokit(TOKENS["dave"])
      .rest.repos.get({ owner: "octo", repo: "missing" })
      .then(
        () => assert.fail("resolved"),
        (e: unknown) => e as { name: string; status: number; message: string },
      );
    assert.equal(err.name, "HttpError");
    assert.equal(err.status, 404);
    assert.match(err.message, /Not Found/);
  });

  test("no Authorization: coordd's own credential answers", async () => {
    const res = await octokit(undefined).rest.users.getAuthenticated();
    assert.equal(res.data.login, "bot");
  });

  test("the upstream down: 503 with Retry-After and X-Coordd-Error", async () => {
    const err = await octokit(TOKENS["dave"], downBase)
      .rest.users.getAuthenticated()
      .then(
        () => assert.fail("resolved"),
        (e: unknown) => e as { status: number; response?: { headers: Record<string, string> } },
      );
    assert.equal(err.status, 503);
    const h = err.response?.headers ?? {};
    assert.match(h["retry-after"] ?? "", /^[1-9][0-9]*$/);
    assert.match(h["x-coordd-error"] ?? "", /^UNAVAILABLE: /);

    const res = await fetch(`${downBase}/user`);
    assert.equal(res.status, 503);
    assert.match(res.headers.get("retry-after") ?? "", /^[1-9][0-9]*$/);
  });

  test("a POST rejects with a clear error", async () => {
    const err = await octokit(TOKENS["erin"])
      .rest.issues.create({ owner: "octo", repo: "cat", title: "hello" })
      .then(
        () => assert.fail("resolved"),
        (e: unknown) => e as { status: number; message: string; cause?: unknown },
      );
    // What octokit makes of a fetch that rejects: a RequestError with
    // status 500 and the error's message.
    assert.equal(err.status, 500);
    assert.match(err.message, /POST .*is not carried/);
    assert.ok(err.cause instanceof NotCarriedError, String(err.cause));
    assert.equal(await api.requests("/repos/octo/cat/issues", "erin"), 0, "the POST reached the upstream");
  });

  test("a POST goes to the named fallback", async () => {
    const sent: string[] = [];
    const fallback: FetchFunction = (input, init) => {
      sent.push(`${init?.method} ${String(input)}`);
      return realFetch(input, init);
    };
    globalThis.fetch = createFetch(client, { fallback });
    try {
      const err = await octokit(TOKENS["frank"])
        .rest.issues.create({ owner: "octo", repo: "cat", title: "hello" })
        .then(
          () => assert.fail("resolved"),
          (e: unknown) => e as { status: number },
        );
      assert.equal(err.status, 405, "the fake API answers a POST 405: the fallback sent it there");
      assert.deepEqual(sent, [`POST ${api.base}/repos/octo/cat/issues`]);
      assert.equal(await api.requests("/repos/octo/cat/issues", "frank"), 1);
      // A GET still goes through coordd.
      assert.equal((await octokit(TOKENS["frank"]).rest.users.getAuthenticated()).headers["x-coordd-upstream"], "github");
      assert.equal(sent.length, 1);
    } finally {
      globalThis.fetch = createFetch(client);
    }
  });

  test("a HEAD answers headers and no body", async () => {
    const res = await octokit(TOKENS["grace"]).request("HEAD /user");
    assert.equal(res.status, 200);
    assert.equal(res.data, ""); // octokit's "no body"
    assert.match(String(res.headers["content-length"]), /^[1-9][0-9]*$/);
    assert.equal(res.headers["x-coordd-upstream"], "github");

    // The same variant (Accept is a forward_header): coordd's cached copy.
    const raw = await fetch(`${api.base}/user`, {
      method: "HEAD",
      headers: { authorization: `token ${TOKENS["grace"]}`, accept: "application/vnd.github.v3+json" },
    });
    assert.equal(raw.status, 200);
    assert.equal(raw.body, null);
    assert.ok(raw.headers.get("etag"));
    assert.equal(raw.headers.get("x-coordd-source"), "l1");
    assert.equal(await api.requests("/user", "grace"), 1, "a HEAD fetches (as a GET) once, and caches");
  });

  test("coordd unreachable: octokit's RequestError, caused by TypeError('fetch failed') and the UnreachableError", async () => {
    const gone = new CoorddClient(`127.0.0.1:${await freePort()}`, { retry: { attempts: 1 } });
    globalThis.fetch = createFetch(gone);
    try {
      const err = await octokit(TOKENS["dave"])
        .rest.users.getAuthenticated()
        .then(
          () => assert.fail("resolved"),
          (e: unknown) => e as { status: number; message: string; cause?: unknown },
        );
      assert.equal(err.status, 500);
      assert.match(err.message, /unreachable/);
      assert.ok(err.cause instanceof TypeError, String(err.cause));
      assert.equal(err.cause.message, "fetch failed");
      assert.ok(err.cause.cause instanceof UnreachableError, String(err.cause.cause));
    } finally {
      gone.close();
      globalThis.fetch = createFetch(client);
    }
  });
});
