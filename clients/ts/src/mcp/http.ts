// Serving MCP Streamable HTTP at /mcp, as the Go server's --http does
// (cmd/mdn-mcp/http.go): stateless, /healthz, drain on SIGTERM, and an
// optional bearer token required of MCP clients.

import { timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";

import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";

import { checkMessage, errorBody, MAX_BODY_BYTES, readBody } from "./jsonrpc.js";

/** MCP_PATH is where MCP Streamable HTTP is served. */
export const MCP_PATH = "/mcp";

/** HTTPOptions configure serveHTTP. */
export interface HTTPOptions {
  /** host and port to listen on. */
  host: string;
  port: number;
  /** token, if set, is the bearer token every MCP request must carry
   * ($MDN_MCP_TOKEN). /healthz needs none. */
  token?: string;
  /** allowedOrigins are the browser origins admitted at /mcp
   * (--allowed-origins, $MDN_MCP_ALLOWED_ORIGINS), as parseOrigins returns
   * them; a request with any other Origin header gets 403. Default: none. */
  allowedOrigins?: ReadonlySet<string>;
  /** drainDelayMs is how long /healthz answers 503 after drain() while
   * requests are still served, for the balancer to notice. Default 0. */
  drainDelayMs?: number;
  /** graceMs bounds how long requests in flight may run once the listener
   * is closed; connections still open then are cut. Default 10 s. */
  graceMs?: number;
  /** log writes one line (stderr). */
  log: (line: string) => void;
}

/** HTTPServer is a running MCP HTTP server. */
export interface HTTPServer {
  /** url is http://host:port/mcp. */
  url: string;
  /** drain answers /healthz 503 for the drain delay, stops accepting, and
   * resolves true once the requests in flight have ended, false if the
   * grace ran out and connections were cut. */
  drain(): Promise<boolean>;
}

/**
 * serveHTTP serves MCP Streamable HTTP at /mcp with a new McpServer from
 * newServer for each request: stateless (no Mcp-Session-Id is issued or
 * read), so that any replica behind a round-robin balancer answers any
 * request with no session affinity. GET and DELETE on /mcp answer 405, as
 * the Go SDK's stateless handler does: there is no session to stream to or
 * to end.
 */
export async function serveHTTP(opts: HTTPOptions, newServer: () => McpServer): Promise<HTTPServer> {
  let draining = false;
  let inFlight = 0;
  let idle: (() => void) | undefined; // called when inFlight drops to 0 while closing
  const server: Server = createServer((req, res) => {
    if (refuseTransferEncoding(req, res)) return;
    inFlight++;
    res.once("close", () => {
      inFlight--;
      if (draining) {
        // Keep-alive connections idle now would otherwise hold close().
        server.closeIdleConnections();
        if (inFlight === 0) idle?.();
      }
    });
    if (draining) res.setHeader("Connection", "close");
    handle(req, res).catch((err: unknown) => {
      opts.log(`${req.method} ${req.url}: ${err instanceof Error ? err.message : String(err)}`);
      if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" }).end("internal error\n");
      else res.destroy();
    });
  });
  server.headersTimeout = 10_000;
  server.keepAliveTimeout = 120_000;

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? "/", "http://x").pathname;
    if (path === "/healthz" && (req.method === "GET" || req.method === "HEAD")) {
      const [code, text] = draining ? [503, "draining\n"] : [200, "ok\n"];
      res.writeHead(code, { "content-type": "text/plain; charset=utf-8" }).end(text);
      return;
    }
    if (path !== MCP_PATH) {
      res.writeHead(404, { "content-type": "text/plain; charset=utf-8" }).end("404 page not found\n");
      return;
    }
    if (!originAllowed(req, opts.allowedOrigins)) {
      res.writeHead(403, { "content-type": "text/plain; charset=utf-8" }).end("mdn-mcp: Origin not allowed (see --allowed-origins)\n");
      return;
    }
    if (!localHostAllowed(req)) {
      res.writeHead(403, { "content-type": "text/plain; charset=utf-8" }).end("Forbidden: invalid Host header\n");
      return;
    }
    if (opts.token && !bearerOK(req.headers.authorization, opts.token)) {
      res
        .writeHead(401, { "content-type": "text/plain; charset=utf-8", "www-authenticate": 'Bearer realm="mdn-mcp"' })
        .end("mdn-mcp: a valid bearer token is required (Authorization: Bearer ...)\n");
      return;
    }
    if (req.method !== "POST") {
      res.writeHead(405, { allow: "POST", "content-type": "text/plain; charset=utf-8" }).end("GET and DELETE are not supported: this server is stateless\n");
      return;
    }
    const text = await readBody(req);
    if (text === undefined) {
      res
        .writeHead(413, { connection: "close", "content-type": "text/plain; charset=utf-8" })
        .end(`request body exceeds ${MAX_BODY_BYTES} bytes\n`);
      return;
    }
    const verdict = checkMessage(text);
    if (verdict.status !== 0) {
      if (verdict.code === undefined) res.writeHead(verdict.status).end();
      else res.writeHead(verdict.status, { "content-type": "application/json" }).end(errorBody(verdict));
      return;
    }
    const mcp = newServer();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.once("close", () => {
      void transport.close();
      void mcp.close();
    });
    await mcp.connect(transport);
    await transport.handleRequest(req, res, verdict.body);
  }

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.host === "" ? undefined : opts.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { address, port } = server.address() as AddressInfo;
  const host = address.includes(":") ? `[${address}]` : address;
  const url = `http://${host}:${port}${MCP_PATH}`;
  opts.log(`serving MCP Streamable HTTP at ${url}${opts.token ? " (bearer token required)" : ""}`);

  let drained: Promise<boolean> | undefined;
  const drain = () =>
    (drained ??= (async () => {
      draining = true;
      const delay = opts.drainDelayMs ?? 0;
      opts.log(`draining: /healthz answers 503 for ${delay} ms`);
      if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
      const grace = opts.graceMs ?? 10_000;
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      opts.log(`draining: no longer accepting; finishing ${inFlight} requests in flight within ${grace} ms`);
      const ended = Promise.all([closed, inFlight === 0 ? Promise.resolve() : new Promise<void>((resolve) => (idle = resolve))]);
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), grace)));
      const ok = await Promise.race([ended.then(() => true), timedOut]);
      clearTimeout(timer);
      if (!ok) {
        opts.log(`${inFlight} requests still in flight after the ${grace} ms grace were cut`);
        server.closeAllConnections();
      } else {
        opts.log("drained");
      }
      return ok;
    })());
  return { url, drain };
}

// refused holds the connections on which a request was refused for its
// Transfer-Encoding.
const refused = new WeakSet<Socket>();

// refuseTransferEncoding answers 400 with Connection: close to a request
// that carries Transfer-Encoding, on every path, as the Go server's
// refuseTransferEncoding does, and reports whether it did: with
// Content-Length too (RFC 9112 6.3; Node refuses that pair itself) it is
// how requests are smuggled past a front proxy that frames by
// Content-Length, and an MCP request is bounded JSON that needs no
// chunking. Node has parsed the body as chunked and may already emit the
// requests pipelined behind it: those are left unanswered and unhandled
// (it also reports true for them) while the connection closes.
function refuseTransferEncoding(req: IncomingMessage, res: ServerResponse): boolean {
  if (refused.has(req.socket)) return true;
  if (req.headers["transfer-encoding"] === undefined) return false;
  refused.add(req.socket);
  res
    .writeHead(400, { connection: "close", "content-type": "text/plain; charset=utf-8" })
    .end("mdn-mcp: Transfer-Encoding is not accepted; send the body with Content-Length\n");
  return true;
}

// bearerOK reports whether an Authorization header carries token.
function bearerOK(header: string | undefined, token: string): boolean {
  const m = /^bearer\s+(.+)$/i.exec((header ?? "").trim());
  if (!m) return false;
  const got = Buffer.from(m[1]!.trim());
  const want = Buffer.from(token);
  return got.length === want.length && timingSafeEqual(got, want);
}

// ORIGIN is an origin as a browser serializes it: scheme://host[:port],
// with no path, query or user information.
const ORIGIN = /^https?:\/\/([a-z0-9.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?$/;

/**
 * parseOrigins reads --allowed-origins: a comma-separated list of exact
 * origins such as https://app.example or http://localhost:3000. Each is
 * lowercased and loses a default port (:80 for http, :443 for https), as a
 * browser sends it. An empty list admits no Origin. It throws, naming the
 * flag, on an entry that is not an origin.
 */
export function parseOrigins(list: string): Set<string> {
  const allowed = new Set<string>();
  for (let o of list.split(",")) {
    o = o.trim().toLowerCase();
    if (o === "") continue;
    if (!ORIGIN.test(o)) {
      throw new Error(`--allowed-origins: ${JSON.stringify(o)} is not an origin: want scheme://host[:port], such as https://app.example, with no path`);
    }
    allowed.add(o.replace(o.startsWith("https:") ? /:443$/ : /:80$/, ""));
  }
  return allowed;
}

// originAllowed reports whether a request's Origin header is absent, one of
// allowed (exact match) or the server's own loopback origin, as the Go
// server's requireOrigin does: a request with no Origin comes from no
// browser, and DNS rebinding needs a browser. An empty Origin and "null"
// are refused. (Node joins repeated Origin headers with ", ", which is
// never an origin.)
function originAllowed(req: IncomingMessage, allowed: ReadonlySet<string> | undefined): boolean {
  const origin = req.headers.origin;
  return origin === undefined || (allowed?.has(origin) ?? false) || sameLoopbackOrigin(origin, req.headers.host);
}

// sameLoopbackOrigin reports whether origin is http://HOST for the Host
// header, and that names a loopback address (localhost, 127.0.0.0/8,
// [::1]): a page the server itself would have served, as the MCP
// conformance suite's DNS-rebinding scenario expects to be admitted. A
// rebinding page cannot send it: its Host and Origin carry the attacker's
// name, never a loopback one.
function sameLoopbackOrigin(origin: string, host: string | undefined): boolean {
  if (host === undefined || origin !== `http://${host}`) return false;
  const name = host.replace(/:\d+$/, "").replace(/^\[(.*)\]$/, "$1");
  return name === "localhost" || LOOPBACK.test(name);
}

const LOOPBACK = /^(127\.\d+\.\d+\.\d+|::1|::ffff:127\.\d+\.\d+\.\d+)$/;

// localHostAllowed refuses, as the Go SDK does, a request that arrived on
// a loopback address with a Host header that is not a loopback name: a
// page the user's browser loaded from elsewhere reaching a local server
// through DNS rebinding.
function localHostAllowed(req: IncomingMessage): boolean {
  if (!LOOPBACK.test(req.socket.localAddress ?? "")) return true;
  const host = (req.headers.host ?? "").replace(/:\d+$/, "").replace(/^\[(.*)\]$/, "$1");
  return host === "localhost" || LOOPBACK.test(host);
}
