import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";

import { Code, ConnectError, MetadataSchema, UnreachableError, type Document } from "../client.js";
import { docURL, MDN, renderDoc, renderSearch, type Getter } from "../mcp/mdn.js";
import { MAP_PATH, mapPage, searchResults } from "./fixtures.js";

const BASE = new URL("https://mdn.test");

test("docURL", async (t) => {
  const cases: { name: string; path: string; want?: string; err?: RegExp }[] = [
    { name: "page", path: MAP_PATH, want: `https://mdn.test${MAP_PATH}/index.json` },
    { name: "trailing slash", path: "/en-US/docs/Web/", want: "https://mdn.test/en-US/docs/Web/index.json" },
    { name: "trailing index.json", path: "/en-US/docs/Web/index.json", want: "https://mdn.test/en-US/docs/Web/index.json" },
    { name: "spaces around", path: "  /en-US/docs/Web  ", want: "https://mdn.test/en-US/docs/Web/index.json" },
    { name: "colon kept", path: "/en-US/docs/Web/CSS/:hover", want: "https://mdn.test/en-US/docs/Web/CSS/:hover/index.json" },
    { name: "escapes kept", path: "/en-US/docs/a%20b", want: "https://mdn.test/en-US/docs/a%20b/index.json" },
    { name: "escaped percent", path: "/en-US/docs/a%25b", err: /must not contain an escaped \/, \. or %/ },
    { name: "empty", path: " ", err: /^path is empty/ },
    { name: "relative", path: "en-US/docs/Web", err: /must start with \// },
    { name: "URL", path: "https://developer.mozilla.org/en-US/docs/Web", err: /is a URL; give only its path/ },
    { name: "protocol-relative", path: "//evil.test/x", err: /is a URL/ },
    { name: "dot-dot", path: "/en-US/docs/../../etc/passwd", err: /must not contain \. or \.\. segments/ },
    { name: "escaped dot-dot", path: "/en-US/%2e%2e/x", err: /must not contain \. or \.\. segments/ },
    { name: "dot", path: "/en-US/./docs", err: /must not contain \. or \.\. segments/ },
    { name: "query", path: "/en-US/docs/Web?x=1", err: /must not contain \?, #/ },
    { name: "fragment", path: "/en-US/docs/Web#x", err: /must not contain \?, #/ },
    { name: "escaped query", path: "/en-US/docs/Web%3Fx", err: /even escaped/ },
    { name: "control character", path: "/en-US/docs/a\nb", err: /control characters/ },
    { name: "bad escape", path: "/en-US/docs/%zz", err: /not a valid path/ },
    { name: "root", path: "/", err: /names no page/ },
    { name: "too long", path: "/" + "a".repeat(600), err: /the limit is 512/ },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      const got = docURL(BASE, c.path);
      if (c.want) assert.equal(got, c.want);
      else {
        assert.equal(typeof got, "object", `docURL(${JSON.stringify(c.path)}) = ${JSON.stringify(got)}; want an error`);
        assert.match((got as { error: string }).error, c.err!);
      }
    });
  }
  await t.test("base path prefix", () => {
    assert.equal(docURL(new URL("http://127.0.0.1:9/mdn/"), "/en-US/docs/Web"), "http://127.0.0.1:9/mdn/en-US/docs/Web/index.json");
  });
});

test("renderDoc has title, summary and sections", () => {
  const md = renderDoc(mapPage.doc, new URL("https://developer.mozilla.org"));
  for (const want of [
    "# Array.prototype.map()\n\nThe map() method of Array instances creates a new array populated",
    `Source: https://developer.mozilla.org${MAP_PATH}\n`,
    "## Syntax\n\n```js\nmap(callbackFn)\n",
    "### Parameters",
    "- `callbackFn`\n  A function to execute",
    "[iterative method](https://developer.mozilla.org/en-US/docs/Web/JavaScript/Reference/Global_Objects/Array#iterative_methods)",
    "- once for each element & index,",
    "> **Note:** `map()` returns a new array — it does not mutate.",
    "## Specifications\n\n- [ECMAScript® 2026 Language Specification](https://tc39.es/ecma262/multipage/indexed-collections.html#sec-array.prototype.map)",
    `## Browser compatibility\n\nSee the compatibility table on MDN: https://developer.mozilla.org${MAP_PATH}#browser_compatibility (browser-compat-data: \`javascript.builtins.Array.map\`)`,
  ]) {
    assert.ok(md.includes(want), `missing ${JSON.stringify(want)} in:\n${md}`);
  }
  assert.doesNotMatch(md, /<[a-z]/, "HTML tags left");
});

test("renderSearch lists the top 10 with paths", () => {
  const md = renderSearch("map", searchResults, BASE);
  assert.match(md, /^Top 10 of 12 MDN results for "map"; read one with mdn_doc and its path\.$/m);
  assert.match(md, /^1\. Result 1\n {3}path: \/en-US\/docs\/Result\/1\n {3}Summary of result 1\.$/m);
  assert.match(md, /^10\. Result 10\n/m);
  assert.doesNotMatch(md, /Result 11/);
  assert.equal(renderSearch("zzz", { documents: [] }, BASE), 'No MDN pages found for "zzz".\n');
});

/** stub answers every get with the same document or error, and records urls. */
function stub(answer: { status?: number; body?: string; err?: Error }): Getter & { urls: string[] } {
  const urls: string[] = [];
  return {
    addr: "coordd.test:1",
    urls,
    async get(url: string): Promise<Document> {
      urls.push(url);
      if (answer.err) throw answer.err;
      const body = new TextEncoder().encode(answer.body ?? "");
      return {
        body,
        metadata: create(MetadataSchema, { statusCode: answer.status ?? 200, size: BigInt(body.length) }),
        progress: [],
        text: () => answer.body ?? "",
      };
    },
  };
}

function text(r: CallToolResult): string {
  return r.content.map((c) => (c.type === "text" ? c.text : "")).join("");
}

test("MDN asks coordd for base + path + /index.json and the search API", async () => {
  const g = stub({ body: JSON.stringify(mapPage) });
  const mdn = new MDN(g, "https://mdn.test/");
  assert.equal((await mdn.doc(MAP_PATH + "/")).isError, undefined);
  assert.equal((await mdn.search(" array  map ")).isError, true); // the page has no "documents"
  assert.deepEqual(g.urls, [`https://mdn.test${MAP_PATH}/index.json`, "https://mdn.test/api/v1/search?q=array+map"]);
});

test("MDN failures are tool errors", async (t) => {
  const cases: { name: string; getter: Getter; want: RegExp }[] = [
    { name: "404", getter: stub({ status: 404 }), want: /^page \/en-US\/docs\/X not found on MDN \(HTTP 404\); use mdn_search/ },
    { name: "500 delivered as a document", getter: stub({ status: 500 }), want: /^MDN answered HTTP 500 for page \/en-US\/docs\/X$/ },
    { name: "not JSON", getter: stub({ body: "<html>" }), want: /^unexpected answer from MDN for page \/en-US\/docs\/X: / },
    { name: "no title", getter: stub({ body: '{"doc":{}}' }), want: /no doc\.title in its index\.json/ },
    {
      name: "refused by coordd",
      getter: stub({ err: new ConnectError("not inside an upstream", Code.PermissionDenied) }),
      want: /coordd at coordd\.test:1 does not serve https:\/\/mdn\.test to this client/,
    },
    {
      name: "no valid token",
      getter: stub({ err: new ConnectError("a bearer token is required", Code.Unauthenticated) }),
      want: /coordd at coordd\.test:1 requires a valid token: set \$COORDD_TOKEN or --coordd-token/,
    },
    {
      name: "upstream down",
      getter: stub({ err: new ConnectError("mdn answered 503", Code.Unavailable) }),
      want: /MDN is unavailable and coordd has no copy \(coordd: mdn answered 503\)/,
    },
    {
      name: "coordd down",
      getter: stub({ err: new UnreachableError("coordd.test:1", new ConnectError("connect ECONNREFUSED", Code.Unavailable)) }),
      want: /^cannot get page \/en-US\/docs\/X: coordd at coordd\.test:1 is unreachable \(connect ECONNREFUSED\)$/,
    },
    {
      name: "timeout",
      getter: stub({ err: new ConnectError("the operation timed out", Code.DeadlineExceeded) }),
      want: /: timed out/,
    },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const r = await new MDN(c.getter, "https://mdn.test").doc("/en-US/docs/X");
      assert.equal(r.isError, true);
      assert.match(text(r), c.want);
    });
  }
});

test("mdn_search checks its query", async () => {
  const mdn = new MDN(stub({}), "https://mdn.test");
  assert.match(text(await mdn.search("  ")), /^query is empty$/);
  assert.match(text(await mdn.search("x".repeat(201))), /the limit is 200/);
});

test("MDN refuses a base that is not an http(s) URL without query", () => {
  for (const base of ["ftp://mdn.test", "not a url", "https://mdn.test/?x=1", "https://mdn.test/#x"]) {
    assert.throws(() => new MDN(stub({}), base), /want an absolute http\(s\) URL/, base);
  }
});
