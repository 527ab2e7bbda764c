// createFetch against a stub coordd (stubcoordd.ts): what goes on the wire
// for a request, and the Response made of each kind of answer; a real
// coordd and an unmodified library are dropin.test.ts's.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, CoorddClient, createFetch, NotCarriedError, Priority, PRIORITY_HEADER, Source, UnreachableError, type FetchFunction } from "../index.js";
import { freePort } from "./harness.js";
import { chunk, document, failure, gate, metadata, startStub, untilAborted, type Stub } from "./stubcoordd.js";

const held = gate(); // opens /held's second chunk
const heldForAbort = gate();
const heldForCancel = gate();
const noMetadataReached = gate(); // opened when /no-metadata's call reaches the stub

let stub: Stub;
let client: CoorddClient;
let fetch: FetchFunction;
const API = "http://api.test";

function heldScript(g: { wait: Promise<void> }) {
  return async function* () {
    yield metadata({ size: 12n, contentType: "text/plain" });
    yield chunk("first-");
    await g.wait;
    yield chunk("second");
  };
}

before(async () => {
  stub = await startStub({
    "/doc": document(
      {
        contentType: "application/json; charset=utf-8",
        etag: 'W/"abc"',
        lastModified: "Tue, 01 Jul 2025 00:00:00 GMT",
        source: Source.L2,
        stale: true,
        age: { seconds: 7n, nanos: 900_000_000 },
        upstream: "api",
        key: "http://api.test/doc",
        headers: [
          { name: "Link", value: '<http://api.test/doc?page=2>; rel="next"' },
          { name: "X-Ratelimit-Remaining", value: "4999" },
          { name: "Vary", value: "Accept" },
          { name: "Vary", value: "Authorization" },
          { name: "X-Name", value: "Zoë" },
        ],
      },
      '{"hello":',
      '"world"}',
    ),
    "/own-type": document({ contentType: "text/plain", headers: [{ name: "Content-Type", value: "text/markdown" }] }, "# hi"),
    "/missing": document({ statusCode: 404, contentType: "application/json" }, '{"message":"Not Found"}'),
    "/empty": document({ statusCode: 204 }),
    "/held": heldScript(held),
    "/held-abort": heldScript(heldForAbort),
    "/held-cancel": heldScript(heldForCancel),
    "/no-metadata": async function* (_req, ctx) {
      noMetadataReached.open();
      await untilAborted(ctx);
    },
    "/short": async function* () {
      yield metadata({ size: 10n });
      yield chunk("1234");
    },
    "/unavailable": async function* () {
      throw failure(Code.Unavailable, "upstream api: dial tcp: connection refused");
    },
    "/breaker": async function* () {
      throw failure(Code.Unavailable, "upstream api: circuit breaker open", 1200);
    },
    "/rate": async function* () {
      throw failure(Code.ResourceExhausted, "upstream api: rate limit: wait past the deadline", 2500);
    },
    "/deadline": async function* () {
      throw failure(Code.DeadlineExceeded, "deadline exceeded\nwhile waiting");
    },
    "/outside": async function* (req) {
      throw failure(Code.PermissionDenied, `url ${req.url} is outside every configured upstream`, undefined, "OUTSIDE_UPSTREAMS");
    },
    "/not-granted": async function* () {
      throw failure(Code.PermissionDenied, 'upstream "api" is not granted to tenant "team-b"', undefined, "NOT_GRANTED");
    },
    "/refused": async function* () {
      throw failure(Code.PermissionDenied, "upstream api does not accept caller credentials", undefined, "CALLER_CREDENTIALS_REFUSED");
    },
  });
  // One attempt: the stub's errors are final, and retries would only slow
  // the tests.
  client = new CoorddClient(stub.addr, { retry: { attempts: 1 }, timeoutMs: 10_000 });
  fetch = createFetch(client);
});

after(async () => {
  held.open();
  heldForAbort.open();
  heldForCancel.open();
  client?.close();
  await stub?.close();
});

function lastCall() {
  const c = stub.calls.at(-1);
  assert.ok(c, "the stub received no call");
  return c;
}

describe("a GET", () => {
  test("sends the headers, the credential apart, and the url without its fragment", async () => {
    const res = await fetch(`${API}/doc?x=1#frag`, {
      headers: {
        Accept: "application/json",
        Authorization: "Bearer tok-a",
        "X-Custom": "Zoë",
        // The same text as its UTF-8 bytes, as a header read off the
        // network holds it.
        "X-Bytes": Buffer.from("Zoë").toString("latin1"),
      },
    });
    await res.arrayBuffer();
    const { req } = lastCall();
    assert.equal(req.url, `${API}/doc?x=1`);
    assert.equal(req.credential, "Bearer tok-a");
    assert.equal(req.head, false);
    const sent = Object.fromEntries(req.headers.map((h) => [h.name, h.value]));
    assert.deepEqual(sent, { accept: "application/json", "x-custom": "Zoë", "x-bytes": "Zoë" });
  });

  test("takes method, headers and signal from a Request, init overriding them", async () => {
    const input = new Request(`${API}/doc`, { headers: { Accept: "text/html", "X-From": "request" } });
    const res = await fetch(input, { headers: { Accept: "application/json" } });
    await res.arrayBuffer();
    const sent = Object.fromEntries(lastCall().req.headers.map((h) => [h.name, h.value]));
    assert.deepEqual(sent, { accept: "application/json" });
    assert.equal(lastCall().req.credential, "");
  });

  test("answers the upstream's status, headers and body, and coordd's facts", async () => {
    const res = await fetch(`${API}/doc`);
    assert.equal(res.status, 200);
    assert.equal(res.statusText, "OK");
    assert.equal(res.ok, true);
    assert.equal(res.url, `${API}/doc`);
    const h = res.headers;
    assert.equal(h.get("link"), '<http://api.test/doc?page=2>; rel="next"');
    assert.equal(h.get("x-ratelimit-remaining"), "4999");
    assert.equal(h.get("vary"), "Accept, Authorization");
    assert.equal(h.get("content-type"), "application/json; charset=utf-8");
    assert.equal(h.get("etag"), 'W/"abc"');
    assert.equal(h.get("last-modified"), "Tue, 01 Jul 2025 00:00:00 GMT");
    assert.equal(h.get("content-length"), "17");
    assert.equal(h.get("age"), "7");
    assert.equal(h.get("x-coordd-source"), "l2");
    assert.equal(h.get("x-coordd-stale"), "true");
    assert.equal(h.get("x-coordd-age"), "7");
    assert.equal(h.get("x-coordd-upstream"), "api");
    assert.equal(h.get("x-coordd-key"), "http://api.test/doc");
    // Bytes as Node's fetch reads them: the value's UTF-8, one character
    // per byte.
    assert.equal(h.get("x-name"), Buffer.from("Zoë").toString("latin1"));
    assert.deepEqual(await res.json(), { hello: "world" });
  });

  test("gives the metadata's Content-Type, as coordd's door does, over a field of the same name", async () => {
    const res = await fetch(`${API}/own-type`);
    assert.equal(res.headers.get("content-type"), "text/plain");
    assert.equal(await res.text(), "# hi");
  });

  test("a 404 is a response", async () => {
    const res = await fetch(`${API}/missing`);
    assert.equal(res.status, 404);
    assert.equal(res.statusText, "Not Found");
    assert.equal(res.ok, false);
    assert.deepEqual(await res.json(), { message: "Not Found" });
  });

  test("a 204 has no body", async () => {
    const res = await fetch(`${API}/empty`);
    assert.equal(res.status, 204);
    assert.equal(res.body, null);
  });
});

test("a HEAD asks for the metadata only and has headers, no body", async () => {
  const res = await fetch(`${API}/doc`, { method: "HEAD" });
  assert.equal(lastCall().req.head, true);
  assert.equal(res.status, 200);
  assert.equal(res.body, null);
  assert.equal(res.headers.get("content-length"), "17");
  assert.equal(res.headers.get("etag"), 'W/"abc"');
  await lastCall().ended;
});

describe("the body", () => {
  test("is streamed: the response and its first chunk come before the rest is sent", async () => {
    const res = await fetch(`${API}/held`);
    assert.equal(res.headers.get("content-length"), "12");
    const reader = res.body!.getReader();
    const first = await reader.read();
    assert.equal(new TextDecoder().decode(first.value), "first-");
    held.open();
    const second = await reader.read();
    assert.equal(new TextDecoder().decode(second.value), "second");
    assert.equal((await reader.read()).done, true);
  });

  test("shorter than its metadata says fails with a TypeError", async () => {
    const res = await fetch(`${API}/short`);
    const err = await res.text().then(
      () => assert.fail("read a body of 4 bytes of 10"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof TypeError, String(err));
    assert.equal(err.message, "terminated");
    assert.ok(err.cause instanceof ConnectError && err.cause.code === Code.Internal, String(err.cause));
    assert.match(err.cause.message, /body is 4 bytes; metadata says 10/);
  });

  test("fails with the signal's reason when it aborts, and coordd's stream ends", async () => {
    const ctl = new AbortController();
    const res = await fetch(`${API}/held-abort`, { signal: ctl.signal });
    const reader = res.body!.getReader();
    assert.equal(new TextDecoder().decode((await reader.read()).value), "first-");
    ctl.abort();
    await assert.rejects(reader.read(), { name: "AbortError" });
    const call = lastCall();
    await call.ended;
    assert.equal(call.cancelled(), true);
  });

  test("cancelled ends coordd's stream", async () => {
    const res = await fetch(`${API}/held-cancel`);
    const reader = res.body!.getReader();
    await reader.read();
    await reader.cancel();
    const call = lastCall();
    await call.ended;
    assert.equal(call.cancelled(), true);
  });
});

test("a signal aborted before the metadata rejects with its reason, and coordd's stream ends", async () => {
  const ctl = new AbortController();
  const p = fetch(`${API}/no-metadata`, { signal: ctl.signal });
  await noMetadataReached.wait;
  ctl.abort();
  await assert.rejects(p, { name: "AbortError" });
  await lastCall().ended;
  assert.equal(lastCall().cancelled(), true);
  // An already aborted signal never reaches coordd.
  const n = stub.calls.length;
  await assert.rejects(fetch(`${API}/doc`, { signal: AbortSignal.abort() }), { name: "AbortError" });
  assert.equal(stub.calls.length, n);
});

test("when coordd cannot answer: a 503, 429 or 504 with X-Coordd-Error, Retry-After on a 503 or 429", async (t) => {
  const cases = [
    { path: "/unavailable", status: 503, retryAfter: "1", error: "UNAVAILABLE: upstream api: dial tcp: connection refused" },
    { path: "/breaker", status: 503, retryAfter: "2", error: "UNAVAILABLE: upstream api: circuit breaker open" },
    { path: "/rate", status: 429, retryAfter: "3", error: "RESOURCE_EXHAUSTED: upstream api: rate limit: wait past the deadline" },
    { path: "/deadline", status: 504, retryAfter: null, error: "DEADLINE_EXCEEDED: deadline exceeded while waiting" },
  ];
  for (const c of cases) {
    await t.test(c.path, async () => {
      const res = await fetch(`${API}${c.path}`);
      assert.equal(res.status, c.status);
      assert.equal(res.ok, false);
      assert.equal(res.headers.get("retry-after"), c.retryAfter);
      assert.equal(res.headers.get("x-coordd-error"), c.error);
      const body = (await res.json()) as { error: { code: number; status: string; retry_after_seconds?: number } };
      assert.equal(body.error.code, c.status);
      assert.equal(body.error.status, c.error.slice(0, c.error.indexOf(":")));
      assert.equal(body.error.retry_after_seconds, c.retryAfter === null ? undefined : Number(c.retryAfter));
    });
  }
});

test("coordd's errors are retried as the client says, but for one that says when to ask again", async () => {
  const retrying = new CoorddClient(stub.addr, { retry: { attempts: 3, baseDelayMs: 1, maxDelayMs: 1 } });
  try {
    const calls = (path: string) => stub.calls.filter((c) => c.req.url === `${API}${path}`).length;
    const f = createFetch(retrying);
    const before = { unavailable: calls("/unavailable"), breaker: calls("/breaker"), rate: calls("/rate") };
    assert.equal((await f(`${API}/unavailable`)).status, 503);
    assert.equal(calls("/unavailable") - before.unavailable, 3, "an Unavailable without RetryInfo: every attempt");
    const res = await f(`${API}/breaker`);
    assert.equal(res.status, 503);
    assert.equal(res.headers.get("retry-after"), "2");
    assert.equal(calls("/breaker") - before.breaker, 1, "a RetryInfo: answered at once");
    assert.equal((await f(`${API}/rate`)).status, 429);
    assert.equal(calls("/rate") - before.rate, 1, "a RetryInfo: answered at once");
  } finally {
    retrying.close();
  }
});

describe("priority", () => {
  test("the X-Coordd-Priority header sets a request's priority and is not sent on", async (t) => {
    const warm = createFetch(client, { priority: "background" });
    const cases: { name: string; fetch: FetchFunction; input: () => string | Request; init?: RequestInit; want: Priority }[] = [
      { name: "none", fetch, input: () => `${API}/doc`, want: Priority.UNSPECIFIED },
      { name: "background", fetch, input: () => `${API}/doc`, init: { headers: { "X-Coordd-Priority": "background" } }, want: Priority.BACKGROUND },
      { name: "interactive", fetch, input: () => `${API}/doc`, init: { headers: { [PRIORITY_HEADER]: "interactive" } }, want: Priority.INTERACTIVE },
      { name: "in another case", fetch, input: () => `${API}/doc`, init: { headers: { [PRIORITY_HEADER]: " Background" } }, want: Priority.BACKGROUND },
      { name: "on a Request", fetch, input: () => new Request(`${API}/doc`, { headers: { [PRIORITY_HEADER]: "background" } }), want: Priority.BACKGROUND },
      { name: "the fetch's default", fetch: warm, input: () => `${API}/doc`, want: Priority.BACKGROUND },
      { name: "the header over the default", fetch: warm, input: () => `${API}/doc`, init: { headers: { [PRIORITY_HEADER]: "interactive" } }, want: Priority.INTERACTIVE },
    ];
    for (const c of cases) {
      await t.test(c.name, async () => {
        const res = await c.fetch(c.input(), c.init);
        await res.arrayBuffer();
        const { req } = lastCall();
        assert.equal(Priority[req.priority], Priority[c.want]);
        assert.ok(!req.headers.some((h) => h.name.toLowerCase() === PRIORITY_HEADER), "the header went to coordd");
      });
    }
  });

  test("a value it does not know rejects with a TypeError before any call", async () => {
    const n = stub.calls.length;
    for (const v of ["urgent", "PRIORITY_BACKGROUND", "background, background"]) {
      const err = await fetch(`${API}/doc`, { headers: { [PRIORITY_HEADER]: v } }).then(
        () => assert.fail("resolved"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof TypeError, String(err));
      assert.match((err as TypeError).message, /x-coordd-priority/);
    }
    assert.equal(stub.calls.length, n);
    assert.throws(() => createFetch(client, { priority: "urgent" as "background" }), TypeError);
  });

  test("the fallback gets the request without the header", async () => {
    const seen: RequestInit[] = [];
    const withFallback = createFetch(client, {
      fallback: async (_input, init) => {
        seen.push(init ?? {});
        return new Response("from the fallback", { status: 201 });
      },
    });
    const input = new Request(`${API}/doc`, { method: "POST", body: "{}", headers: { [PRIORITY_HEADER]: "background", "X-Other": "1" } });
    const res = await withFallback(input);
    assert.equal(res.status, 201);
    const h = new Headers(seen.at(-1)?.headers);
    assert.equal(h.get(PRIORITY_HEADER), null);
    assert.equal(h.get("x-other"), "1");
    assert.equal(input.headers.get(PRIORITY_HEADER), "background", "the caller's Request was changed");
  });

  test("CoorddClient.get sends the priority it is given", async () => {
    for (const [p, want] of [[undefined, Priority.UNSPECIFIED], ["interactive", Priority.INTERACTIVE], ["background", Priority.BACKGROUND]] as const) {
      await client.get(`${API}/doc`, { priority: p });
      assert.equal(Priority[lastCall().req.priority], Priority[want]);
    }
    const n = stub.calls.length;
    await assert.rejects(client.get(`${API}/doc`, { priority: "urgent" as "background" }), TypeError);
    assert.equal(stub.calls.length, n);
  });
});

describe("a request coordd cannot carry", () => {
  const refused: { name: string; input: () => string | Request; init?: RequestInit; why: RegExp }[] = [
    { name: "POST", input: () => `${API}/doc`, init: { method: "POST", body: "{}" }, why: /POST is not carried/ },
    { name: "DELETE", input: () => `${API}/doc`, init: { method: "DELETE" }, why: /DELETE is not carried/ },
    { name: "a POST Request", input: () => new Request(`${API}/doc`, { method: "POST", body: "{}" }), why: /POST is not carried/ },
    { name: "a GET with a body", input: () => `${API}/doc`, init: { body: "x" }, why: /GET with a body is not carried/ },
    { name: "a data: URL", input: () => "data:text/plain,hi", why: /data: URL is not carried/ },
    { name: "a URL outside every upstream", input: () => `${API}/outside?token=secret`, why: /coordd does not carry it/ },
    { name: "a credential its upstream refuses", input: () => `${API}/refused`, init: { headers: { Authorization: "Bearer t" } }, why: /coordd does not carry it/ },
  ];

  test("rejects with a NotCarriedError, a TypeError that says why", async (t) => {
    for (const c of refused) {
      await t.test(c.name, async () => {
        const err = await fetch(c.input(), c.init).then(
          () => assert.fail("resolved"),
          (e: unknown) => e,
        );
        assert.ok(err instanceof NotCarriedError, String(err));
        assert.ok(err instanceof TypeError);
        assert.match(err.message, c.why);
        assert.match(err.message, /fallback/);
        assert.doesNotMatch(err.message, /secret/, "the message quotes the query");
      });
    }
  });

  test("goes to the fallback, with the caller's own arguments", async (t) => {
    const seen: { input: unknown; init: RequestInit | undefined }[] = [];
    const withFallback = createFetch(client, {
      fallback: async (input, init) => {
        seen.push({ input, init });
        return new Response("from the fallback", { status: 201 });
      },
    });
    for (const c of refused) {
      await t.test(c.name, async () => {
        const input = c.input();
        const res = await withFallback(input, c.init);
        assert.equal(res.status, 201);
        assert.equal(await res.text(), "from the fallback");
        const got = seen.at(-1);
        assert.equal(got?.input, input);
        assert.equal(got?.init, c.init);
        if (input instanceof Request) assert.equal(input.bodyUsed, false, "the fallback got a Request whose body was used");
      });
    }
  });
});

test("another error from coordd rejects with a TypeError whose cause is the ConnectError", async () => {
  const err = await fetch(`${API}/not-granted`).then(
    () => assert.fail("resolved"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof TypeError && !(err instanceof NotCarriedError), String(err));
  assert.match(err.message, /PERMISSION_DENIED: upstream "api" is not granted to tenant "team-b"/);
  assert.ok(err.cause instanceof ConnectError && err.cause.code === Code.PermissionDenied);
});

test("coordd unreachable: TypeError('fetch failed') whose cause is the UnreachableError, as Node's fetch", async () => {
  const gone = new CoorddClient(`127.0.0.1:${await freePort()}`, { retry: { attempts: 1 } });
  try {
    const err = await createFetch(gone)(`${API}/doc`).then(
      () => assert.fail("resolved"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof TypeError, String(err));
    assert.equal(err.message, "fetch failed");
    assert.ok(err.cause instanceof UnreachableError, String(err.cause));
    // The same shape as Node's own fetch to a closed port.
    const node = await globalThis.fetch(`http://127.0.0.1:${await freePort()}/`).then(
      () => assert.fail("resolved"),
      (e: unknown) => e,
    );
    assert.ok(node instanceof TypeError && node.message === "fetch failed" && node.cause instanceof Error);
  } finally {
    gone.close();
  }
});
