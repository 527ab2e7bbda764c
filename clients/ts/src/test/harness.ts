// Test harness: real coordd processes built from this repository, alone
// or several sharing a redis-server, in front of a fake MDN served from this
// process or the fake GitHub-like API of internal/testing/fakeapi (fakeapid).

import { spawn, execFile, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer as createHTTPServer, type Server } from "node:http";
import { get as httpGet } from "node:http";
import { connect, createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as delay } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

/** REPO_ROOT is the repository root (this file runs from clients/ts/dist/test/). */
export const REPO_ROOT = fileURLToPath(new URL("../../../../", import.meta.url));

/** SERVER_JS is the built MCP server. */
export const SERVER_JS = fileURLToPath(new URL("../mcp/server.js", import.meta.url));

/** freePort returns a loopback port that was free a moment ago. */
export async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve, reject) => s.listen(0, "127.0.0.1", resolve).once("error", reject));
  const { port } = s.address() as AddressInfo;
  await new Promise((resolve) => s.close(resolve));
  return port;
}

function goBinary(): string {
  if (process.env["GO"]) return process.env["GO"];
  const paths = (process.env["PATH"] ?? "").split(":");
  if (paths.some((p) => p && existsSync(join(p, "go")))) return "go";
  return "/usr/local/go/bin/go";
}

const builds = new Map<string, Promise<string>>();

/** goBuild builds the Go command at pkg (such as ./cmd/coordd) once per
 * process into a temporary directory, removed at exit, and returns the
 * binary's path. */
export function goBuild(pkg: string): Promise<string> {
  let built = builds.get(pkg);
  if (!built) {
    built = (async () => {
      if (!existsSync(join(REPO_ROOT, "go.mod"))) throw new Error(`no go.mod in ${REPO_ROOT}`);
      const dir = mkdtempSync(join(tmpdir(), "coordd-ts-test-"));
      process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
      const bin = join(dir, pkg.split("/").pop() ?? "cmd");
      try {
        await promisify(execFile)(goBinary(), ["build", "-o", bin, pkg], { cwd: REPO_ROOT });
      } catch (err) {
        const e = err as { stderr?: string; message: string };
        throw new Error(`go build ${pkg}: ${e.stderr || e.message}`);
      }
      return bin;
    })();
    builds.set(pkg, built);
  }
  return built;
}

/** buildCoordd builds ./cmd/coordd once per process. $COORDD_BIN, if set,
 * names a coordd binary to use instead. */
export function buildCoordd(): Promise<string> {
  if (process.env["COORDD_BIN"]) return Promise.resolve(process.env["COORDD_BIN"]);
  return goBuild("./cmd/coordd");
}

/** Coordd is a running coordd process. */
export interface Coordd {
  addr: string;
  /** stderr collects coordd's log, for failure messages. */
  stderr(): string;
  /** stop ends coordd gracefully (SIGTERM), killing it after 5 s. */
  stop(): Promise<void>;
  /** kill ends coordd at once (SIGKILL), as a crash would. */
  kill(): void;
}

/** CoorddOptions configure startCoordd. */
export interface CoorddOptions {
  /** config is YAML (tls, tenants, upstreams) added to the harness's own
   * settings (drain_delay, max_age_floor, which it must not repeat) in
   * the file given as --config. */
  config?: string;
  /** env is added to coordd's environment (tokens_env). */
  env?: Record<string, string>;
  /** redis is a Redis URL (Redis.url): instances given the same one share
   * a cache and one fetch per key. Default: single-node mode. */
  redis?: string;
}

/** startCoordd starts coordd on a free port with the given upstreams (and
 * those of opts.config), in single-node mode unless opts.redis, and
 * resolves once the port accepts connections. */
export async function startCoordd(upstreams: Record<string, string>, opts: CoorddOptions = {}): Promise<Coordd> {
  const bin = await buildCoordd();
  const addr = `127.0.0.1:${await freePort()}`;
  // Tests stop coordd often: no drain delay; and no max_age floor, so that
  // a test can refuse a copy milliseconds old.
  const dir = mkdtempSync(join(tmpdir(), "coordd-conf-"));
  const config = join(dir, "coordd.yaml");
  writeFileSync(config, `drain_delay: 1ms\nmax_age_floor: -1ns\n${opts.config ?? ""}`);
  const args = ["--config", config, "--listen", addr];
  for (const [name, base] of Object.entries(upstreams)) args.push("--upstream", `${name}=${base}`);
  if (opts.redis) args.push("--redis", opts.redis);
  const proc = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...opts.env } });
  let log = "";
  proc.stderr!.setEncoding("utf8").on("data", (s: string) => (log += s));
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
    const t = setTimeout(() => proc.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(t);
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await waitForPort("coordd", addr, proc, 20_000);
  } catch (err) {
    await stop();
    throw new Error(`${(err as Error).message}\ncoordd log:\n${log}`);
  }
  return { addr, stderr: () => log, stop, kill: () => proc.kill("SIGKILL") };
}

async function waitForPort(what: string, addr: string, proc: ChildProcess, timeoutMs: number): Promise<void> {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(":")), Number(addr.slice(addr.lastIndexOf(":") + 1))];
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`${what} exited with status ${proc.exitCode}`);
    const ok = await new Promise<boolean>((resolve) => {
      const c = connect(port, host, () => {
        c.destroy();
        resolve(true);
      }).once("error", () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`${what} did not listen on ${addr} within ${timeoutMs} ms`);
    await delay(50);
  }
}

/** Redis is a running redis-server. */
export interface Redis {
  /** url is its redis:// URL, for coordd's --redis. */
  url: string;
  /** stop ends it and removes its directory. */
  stop(): Promise<void>;
}

// redisServer finds redis-server: $REDIS_SERVER, else on PATH, else
// Debian's /usr/bin/redis-server.
function redisServer(): string {
  if (process.env["REDIS_SERVER"]) return process.env["REDIS_SERVER"];
  for (const p of (process.env["PATH"] ?? "").split(delimiter)) {
    if (p && existsSync(join(p, "redis-server"))) return join(p, "redis-server");
  }
  if (existsSync("/usr/bin/redis-server")) return "/usr/bin/redis-server";
  throw new Error("redis-server not found: install it (apt-get install redis-server) or set REDIS_SERVER to its path");
}

/** startRedis starts a redis-server on a free loopback port, keeping
 * nothing on disk, and resolves once it accepts connections. */
export async function startRedis(): Promise<Redis> {
  const bin = redisServer();
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "coordd-ts-redis-"));
  const args = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no", "--logfile", ""];
  const proc = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  proc.stdout!.setEncoding("utf8").on("data", (s: string) => (log += s));
  proc.stderr!.setEncoding("utf8").on("data", (s: string) => (log += s));
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
    const t = setTimeout(() => proc.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(t);
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await waitForPort("redis-server", `127.0.0.1:${port}`, proc, 20_000);
  } catch (err) {
    await stop();
    throw new Error(`${(err as Error).message}\nredis-server log:\n${log}`);
  }
  return { url: `redis://127.0.0.1:${port}/0`, stop };
}

/** FakeAPI is a running fakeapid (internal/testing/fakeapi): a GitHub-like JSON
 * API whose answers name the login they were made for ("viewer"). */
export interface FakeAPI {
  /** base is its base URL, without a trailing slash. */
  base: string;
  /** stats returns the requests it counted, by path (with the query, as
   * sent) and login ("" anonymous). */
  stats(): Promise<FakeAPIHit[]>;
  /** requests returns how many requests for path (with its query) were
   * made as login. */
  requests(path: string, login: string): Promise<number>;
  /** close ends it (closing its stdin) and waits for its exit. */
  close(): Promise<void>;
}

/** FakeAPIHit is one row of the fake API's GET /_fake/stats. */
export interface FakeAPIHit {
  path: string;
  login: string;
  count: number;
}

/** FakeAPIOptions configure startFakeAPI. */
export interface FakeAPIOptions {
  /** tokens maps a login to its token; a request sends "Authorization:
   * Bearer <token>" or "token <token>". */
  tokens: Record<string, string>;
  /** delayMs holds every answer back, so that concurrent calls overlap. */
  delayMs?: number;
}

/** startFakeAPI builds and starts ./internal/testing/fakeapi/fakeapid on a free
 * loopback port. */
export async function startFakeAPI(opts: FakeAPIOptions): Promise<FakeAPI> {
  const bin = await goBuild("./internal/testing/fakeapi/fakeapid");
  const args = ["-tokens", Object.entries(opts.tokens).map(([login, tok]) => `${login}=${tok}`).join(",")];
  if (opts.delayMs) args.push("-delay", `${opts.delayMs}ms`);
  const proc = spawn(bin, args, { stdio: ["pipe", "pipe", "pipe"] });
  let log = "";
  proc.stderr!.setEncoding("utf8").on("data", (s: string) => (log += s));
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  const lines = createInterface({ input: proc.stdout! });
  const base = await new Promise<string>((resolve, reject) => {
    lines.once("line", resolve);
    proc.once("exit", (code) => reject(new Error(`fakeapid exited with status ${code} before printing its url\n${log}`)));
  });
  lines.close();
  proc.stdout!.resume();
  const stats = () =>
    new Promise<FakeAPIHit[]>((resolve, reject) => {
      // node:http, not fetch: a test may have replaced globalThis.fetch.
      httpGet(`${base}/_fake/stats`, (res) => {
        let body = "";
        res.setEncoding("utf8").on("data", (s: string) => (body += s));
        res.on("end", () => {
          try {
            resolve((JSON.parse(body) as { hits: FakeAPIHit[] }).hits);
          } catch (err) {
            reject(new Error(`fakeapid stats: ${res.statusCode}: ${body}: ${String(err)}`));
          }
        });
      }).once("error", reject);
    });
  return {
    base,
    stats,
    requests: async (path, login) => (await stats()).find((h) => h.path === path && h.login === login)?.count ?? 0,
    close: async () => {
      proc.stdin!.end();
      const t = setTimeout(() => proc.kill("SIGKILL"), 5000);
      await exited;
      clearTimeout(t);
    },
  };
}

/** FakeMDN serves fixed MDN pages and search results, and counts requests. */
export interface FakeMDN {
  base: string;
  /** requests returns how many requests reached path (query excluded). */
  requests(path: string): number;
  close(): Promise<void>;
}

/** FakeMDNOptions configure startFakeMDN. */
export interface FakeMDNOptions {
  /** pages maps a page path (no /index.json) to its index.json. */
  pages: Record<string, unknown>;
  /** search is the answer to /api/v1/search, whatever the query. */
  search: unknown;
  /** raw maps a path to a body served as it is. */
  raw?: Record<string, Uint8Array>;
  /** delayMs holds each answer back, so that concurrent calls overlap. */
  delayMs?: number;
}

/** startFakeMDN serves opts on a free loopback port. Unknown paths get 404. */
export async function startFakeMDN(opts: FakeMDNOptions): Promise<FakeMDN> {
  const counts = new Map<string, number>();
  const server: Server = createHTTPServer((req, res) => {
    const path = new URL(req.url ?? "/", "http://x").pathname;
    counts.set(path, (counts.get(path) ?? 0) + 1);
    const answer = () => {
      const raw = opts.raw?.[path];
      if (raw && req.method === "GET") {
        res.writeHead(200, { "content-type": "application/octet-stream" }).end(raw);
        return;
      }
      const page = path.endsWith("/index.json") ? opts.pages[path.slice(0, -"/index.json".length)] : undefined;
      const body = path === "/api/v1/search" ? opts.search : page;
      if (req.method !== "GET" || body === undefined) {
        res.writeHead(404, { "content-type": "application/json" }).end('{"error":"not found"}');
        return;
      }
      res.writeHead(200, { "content-type": "application/json; charset=utf-8" }).end(JSON.stringify(body));
    };
    setTimeout(answer, opts.delayMs ?? 0);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    base: `http://127.0.0.1:${port}`,
    requests: (path) => counts.get(path) ?? 0,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

/** Certs are throwaway PEM files: a CA, a server certificate for 127.0.0.1
 * and localhost, and a client certificate, all signed by the CA. */
export interface Certs {
  dir: string;
  caFile: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  /** read returns a file's contents. */
  read(path: string): Buffer;
}

/** makeCerts makes Certs with the openssl command (Debian's openssl
 * package; ca-certificates depends on it), in a directory removed at exit. */
export async function makeCerts(): Promise<Certs> {
  const dir = mkdtempSync(join(tmpdir(), "coordd-ts-certs-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  const f = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => promisify(execFile)("openssl", args, { cwd: dir });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  await openssl("req", "-x509", ...ec, "-keyout", f("ca-key.pem"), "-out", f("ca.pem"), "-days", "1", "-subj", "/CN=coordd-ts-test-ca");
  const issue = async (name: string, ext: string) => {
    writeFileSync(f(`${name}.ext`), ext);
    await openssl("req", ...ec, "-keyout", f(`${name}-key.pem`), "-out", f(`${name}.csr`), "-subj", `/CN=${name}`);
    await openssl("x509", "-req", "-in", f(`${name}.csr`), "-CA", f("ca.pem"), "-CAkey", f("ca-key.pem"), "-CAcreateserial",
      "-out", f(`${name}.pem`), "-days", "1", "-extfile", f(`${name}.ext`));
  };
  await issue("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  await issue("client", "extendedKeyUsage=clientAuth\n");
  return {
    dir,
    caFile: f("ca.pem"),
    serverCert: f("server.pem"),
    serverKey: f("server-key.pem"),
    clientCert: f("client.pem"),
    clientKey: f("client-key.pem"),
    read: (path) => readFileSync(path),
  };
}
