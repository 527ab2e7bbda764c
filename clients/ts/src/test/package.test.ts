// The package as npm would publish it: its tarball (npm pack --dry-run), its
// entries as an outside project resolves them through the exports map, and
// its public types compiled without @types/node. Run after the build
// (npm test builds first): they read dist/.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { REPO_ROOT } from "./harness.js";
import { document, startStub } from "./stubcoordd.js";

const run = promisify(execFile);
const PKG = fileURLToPath(new URL("../../", import.meta.url)); // clients/ts/
const pkg = JSON.parse(readFileSync(join(PKG, "package.json"), "utf8")) as {
  name: string;
  private?: boolean;
  license?: string;
  exports?: Record<string, string | { types?: string; default?: string }>;
  bin?: Record<string, string>;
  files?: string[];
  scripts?: Record<string, string>;
};

// npm as it runs this suite (npm test sets npm_execpath), else npm on PATH.
function npm(args: string[]) {
  const cli = process.env["npm_execpath"];
  return cli && cli.endsWith(".js")
    ? run(process.execPath, [cli, ...args], { cwd: PKG, maxBuffer: 16 << 20 })
    : run("npm", args, { cwd: PKG, maxBuffer: 16 << 20 });
}

// outside is a project beside the repository that depends on this package,
// linked into its node_modules as an installed package would be.
let outside: string;
before(() => {
  outside = mkdtempSync(join(tmpdir(), "coordd-ts-pkg-"));
  mkdirSync(join(outside, "node_modules", "@coordd"), { recursive: true });
  symlinkSync(PKG.replace(/\/$/, ""), join(outside, "node_modules", pkg.name), "dir");
  writeFileSync(join(outside, "package.json"), JSON.stringify({ private: true, type: "module" }));
});
after(() => rmSync(outside, { recursive: true, force: true }));

test("package.json is publishable: not private, Apache-2.0, an exports map, a prepare script", () => {
  assert.equal(pkg.private, undefined, "private: true stops npm publish");
  assert.equal(pkg.license, "Apache-2.0");
  assert.deepEqual(Object.keys(pkg.exports ?? {}).sort(), [".", "./mcp", "./package.json"]);
  // prepare builds dist/ when the package is installed from git, where no
  // dist/ is committed.
  assert.match(pkg.scripts?.["prepare"] ?? "", /\bbuild\b/);
});

test("npm pack ships the built entries, LICENSE and README, and no tests", async () => {
  // --ignore-scripts: packing runs prepare, which would rebuild dist/ under
  // the tests that are running from it.
  const { stdout } = await npm(["pack", "--dry-run", "--json", "--ignore-scripts"]);
  const [packed] = JSON.parse(stdout) as { files: { path: string }[] }[];
  assert.ok(packed, "npm pack --json printed no package");
  const files = new Set(packed.files.map((f) => f.path));
  const targets = Object.values(pkg.exports ?? {}).flatMap((e) => (typeof e === "string" ? [e] : [e.types!, e.default!]));
  for (const want of ["package.json", "README.md", "LICENSE", ...targets, ...Object.values(pkg.bin ?? {})]) {
    assert.ok(files.has(want.replace(/^\.\//, "")), `${want} is missing from the tarball: ${[...files].join(", ")}`);
  }
  const tests = [...files].filter((f) => /(^|\/)test\//.test(f) || /\.test\.[cm]?[jt]s/.test(f));
  assert.deepEqual(tests, [], "tests in the tarball");
  assert.equal(
    readFileSync(join(PKG, "LICENSE"), "utf8"),
    readFileSync(join(REPO_ROOT, "LICENSE"), "utf8"),
    "clients/ts/LICENSE differs from the repository's LICENSE",
  );
});

// HOOKS logs, to $RESOLVED_LOG, the URL of every module Node resolves,
// and "FAILED <specifier>" for every one it cannot.
const HOOKS = `import { appendFileSync } from "node:fs";
export async function resolve(specifier, context, next) {
  let r;
  try {
    r = await next(specifier, context);
  } catch (err) {
    appendFileSync(process.env.RESOLVED_LOG, "FAILED " + specifier + "\\n");
    throw err;
  }
  appendFileSync(process.env.RESOLVED_LOG, r.url + "\\n");
  return r;
}
`;

// loaded imports entry from the outside project and returns the URL of
// every module Node resolved while loading it, as a resolve hook saw them.
async function loaded(entry: string): Promise<string[]> {
  const log = join(outside, `resolved-${entry.replace(/\W/g, "_")}.txt`);
  writeFileSync(log, "");
  writeFileSync(join(outside, "hooks.mjs"), HOOKS);
  writeFileSync(
    join(outside, "main.mjs"),
    `import { register } from "node:module";
register("./hooks.mjs", import.meta.url);
const m = await import(process.argv[2]);
if (Object.keys(m).length === 0) throw new Error("no exports");
`,
  );
  await run(process.execPath, ["main.mjs", entry], { cwd: outside, env: { ...process.env, RESOLVED_LOG: log } });
  return readFileSync(log, "utf8").split("\n").filter(Boolean);
}

const heavy = (urls: string[]) => urls.filter((u) => /\/node_modules\/(@modelcontextprotocol\/|zod\/|parse5\/|@opentelemetry\/|@octokit\/)/.test(u));

test("importing the client loads neither the MCP SDK, zod nor @opentelemetry/api; the ./mcp entry does", async () => {
  const client = await loaded(pkg.name);
  assert.ok(client.some((u) => u.endsWith("/dist/client.js")), `the client entry was not loaded: ${client.join("\n")}`);
  assert.ok(client.some((u) => u.includes("/node_modules/@connectrpc/")), "the hook saw no dependency load");
  assert.deepEqual(heavy(client), [], `${pkg.name} loads the MCP server's dependencies`);

  // The same probe sees them where they are used, so that the check above
  // cannot pass by not seeing anything.
  const mcp = await loaded(`${pkg.name}/mcp`);
  assert.ok(mcp.some((u) => u.includes("/node_modules/@modelcontextprotocol/sdk/")), "./mcp did not load the MCP SDK");
  assert.ok(mcp.some((u) => u.includes("/node_modules/zod/")), "./mcp did not load zod");
});

test("without @opentelemetry/api installed, the client loads and calls, with no trace context", async () => {
  // A project where the package is installed as a copy (a symlink would
  // resolve from clients/ts/, whose node_modules has the API), beside every
  // dependency of clients/ts but @opentelemetry/*.
  const bare = mkdtempSync(join(tmpdir(), "coordd-ts-nootel-"));
  const stub = await startStub({ "/doc": document({ contentType: "text/plain" }, "hello") });
  try {
    const modules = join(bare, "node_modules");
    const installed = join(modules, "@coordd", "client");
    mkdirSync(installed, { recursive: true });
    cpSync(join(PKG, "package.json"), join(installed, "package.json"));
    cpSync(join(PKG, "dist"), join(installed, "dist"), { recursive: true, filter: (src) => !/[\\/]dist[\\/]test([\\/]|$)/.test(src) });
    for (const name of readdirSync(join(PKG, "node_modules"))) {
      if (name.startsWith(".") || name === "@coordd" || name === "@opentelemetry") continue;
      symlinkSync(join(PKG, "node_modules", name), join(modules, name), "dir");
    }
    writeFileSync(join(bare, "package.json"), JSON.stringify({ private: true, type: "module" }));
    writeFileSync(join(bare, "hooks.mjs"), HOOKS);
    writeFileSync(
      join(bare, "main.mjs"),
      `import { register } from "node:module";
register("./hooks.mjs", import.meta.url);
const { CoorddClient, createFetch } = await import("${pkg.name}");
const client = new CoorddClient(process.argv[2], { retry: { attempts: 1 } });
const doc = await client.get("http://api.test/doc");
const res = await createFetch(client)("http://api.test/doc");
console.log(JSON.stringify({ get: doc.text(), fetch: await res.text() }));
client.close();
`,
    );
    const log = join(bare, "resolved.txt");
    writeFileSync(log, "");
    const { stdout } = await run(process.execPath, ["main.mjs", stub.addr], { cwd: bare, env: { ...process.env, RESOLVED_LOG: log } });
    assert.deepEqual(JSON.parse(stdout), { get: "hello", fetch: "hello" });
    const resolved = readFileSync(log, "utf8").split("\n").filter(Boolean);
    assert.ok(resolved.some((u) => u.endsWith(`/${installed.split("/").slice(-2).join("/")}/dist/client.js`)), `the copy was not loaded:\n${resolved.join("\n")}`);
    assert.ok(resolved.includes("FAILED @opentelemetry/api"), `the client did not look for @opentelemetry/api:\n${resolved.join("\n")}`);
    assert.deepEqual(resolved.filter((u) => u.includes("@opentelemetry")), ["FAILED @opentelemetry/api"]);
    assert.equal(stub.calls.length, 2);
    for (const c of stub.calls) assert.equal(c.header.get("traceparent"), null);
  } finally {
    await stub.close();
    rmSync(bare, { recursive: true, force: true });
  }
});

test("the public types compile without @types/node", async () => {
  // types: [] keeps @types/node out; lib DOM gives the fetch API's types
  // (Headers, AbortSignal) that Connect's types name, as a browser, Deno or
  // Bun project has them. skipLibCheck: false checks every .d.ts reached.
  const tsconfig = {
    compilerOptions: {
      target: "ES2022",
      lib: ["ES2023", "DOM"],
      module: "NodeNext",
      moduleResolution: "NodeNext",
      types: [],
      strict: true,
      noEmit: true,
      skipLibCheck: false,
    },
  };
  const tsc = join(PKG, "node_modules", "typescript", "bin", "tsc");
  const compile = async (name: string, source: string): Promise<string> => {
    writeFileSync(join(outside, `${name}.ts`), source);
    writeFileSync(join(outside, `tsconfig.${name}.json`), JSON.stringify({ ...tsconfig, files: [`${name}.ts`] }));
    try {
      await run(process.execPath, [tsc, "-p", `tsconfig.${name}.json`], { cwd: outside });
      return "";
    } catch (err) {
      return String((err as { stdout?: string }).stdout ?? err);
    }
  };
  const uses = `import { CoorddClient, Code, BodyTooLargeError, createFetch, NotCarriedError, type ClientOptions, type Document, type FetchFunction } from "${pkg.name}";
import { MDN, newServer, serveHTTP, type HTTPServer } from "${pkg.name}/mcp";
const opts: ClientOptions = { token: "t", tls: { ca: new Uint8Array(0), cert: "pem" }, retry: { attempts: 2 } };
const c = new CoorddClient("127.0.0.1:50051", opts);
const d: Promise<Document> = c.get("https://developer.mozilla.org/", { signal: new AbortController().signal });
const code: Code = Code.Unavailable;
export type Served = HTTPServer;
export { d, code, BodyTooLargeError, serveHTTP };
newServer(new MDN(c));
const fallback: FetchFunction = globalThis.fetch;
globalThis.fetch = createFetch(c, { fallback, retry: { maxRetryInfoWaitMs: 0 } });
const notCarried: TypeError = new NotCarriedError("POST", "https://api.github.com/", "a POST is not carried");
export { notCarried };
`;
  // One compile (tsc on these types takes a while): the package's uses must
  // give no error, and the control, Node's Buffer, must give one, so that
  // the check proves something (nothing brought @types/node in).
  const out = await compile("uses", `${uses}\nBuffer.from("x");\n`);
  const errors = out.split("\n").filter((l) => l.includes("error TS"));
  assert.equal(errors.length, 1, `the package's types need @types/node:\n${out}`);
  assert.match(errors[0]!, /^uses\.ts\(\d+,\d+\): error TS\d+: Cannot find name 'Buffer'/);
});
