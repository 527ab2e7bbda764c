#!/usr/bin/env node
// Command server is an MCP server offering mdn_doc and mdn_search, which
// read MDN through coordd instead of fetching it themselves. It speaks MCP
// on stdio, or with --http serves MCP Streamable HTTP at /mcp, stateless,
// as the Go server (cmd/mdn-mcp) does.
//
//	node dist/mcp/server.js [--coordd HOST:PORT] [--mdn-base URL] [--timeout DURATION]
//	  [--coordd-token TOKEN] [--coordd-tls] [--coordd-tls-ca FILE]
//	  [--coordd-tls-cert FILE --coordd-tls-key FILE]
//	  [--http ADDR [--allowed-origins ORIGINS] [--drain-delay DURATION] [--shutdown-grace DURATION]]

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

import { CoorddClient, DEFAULT_ADDR, type ClientOptions } from "../client.js";
import { parseOrigins, serveHTTP } from "./http.js";
import { newServer } from "./tools.js";
import { DEFAULT_MDN_BASE, MDN } from "./mdn.js";

const USAGE = `usage: server [--coordd HOST:PORT] [--mdn-base URL] [--timeout DURATION] [--coordd-token TOKEN]
              [--coordd-tls] [--coordd-tls-ca FILE] [--coordd-tls-cert FILE --coordd-tls-key FILE]
              [--http ADDR [--allowed-origins ORIGINS] [--drain-delay DURATION] [--shutdown-grace DURATION]]

  --coordd ADDR            coordd's gRPC address (default ${DEFAULT_ADDR})
  --mdn-base URL           MDN's base URL; coordd must have it as an upstream (default ${DEFAULT_MDN_BASE})
  --timeout DURATION       deadline of one tool call's fetch through coordd, retries included,
                           such as 30s, 1500ms or 2m (default 30s)
  --coordd-token TOKEN     bearer token for a coordd that requires one (default $COORDD_TOKEN,
                           which keeps it out of sight of ps)
  --coordd-tls             dial coordd over TLS, trusting the system's roots
  --coordd-tls-ca FILE     dial coordd over TLS, trusting the CAs in this PEM file
  --coordd-tls-cert FILE   client certificate PEM file, for a coordd that requires one (mutual TLS)
  --coordd-tls-key FILE    the client certificate's key PEM file
  --http ADDR              serve MCP Streamable HTTP at http://ADDR/mcp (host:port, or :port for
                           every interface) instead of stdio, stateless; MCP clients must send
                           $MDN_MCP_TOKEN as a bearer token if it is set
  --allowed-origins ORIGINS  with --http: comma-separated origins (scheme://host[:port]) of browser
                           front-ends admitted at /mcp; a request with any other Origin header
                           gets 403 (default $MDN_MCP_ALLOWED_ORIGINS, else none)
  --drain-delay DURATION   with --http: how long /healthz answers 503 after SIGTERM before the
                           listener closes, for the balancer to notice (default 0s)
  --shutdown-grace DURATION  with --http: how long requests in flight may run once the listener
                           is closed (default 10s)
`;

/** securityOptions turns the security flags into ClientOptions. Errors
 * name the flag, never the token. */
function securityOptions(v: {
  token?: string;
  tls?: boolean;
  ca?: string;
  cert?: string;
  key?: string;
}): ClientOptions {
  const opts: ClientOptions = {};
  if (v.token) opts.token = v.token;
  if ((v.cert === undefined) !== (v.key === undefined)) {
    throw new Error("--coordd-tls-cert and --coordd-tls-key go together");
  }
  if (!v.tls && v.ca === undefined && v.cert === undefined) return opts;
  const read = (flag: string, path: string) => {
    try {
      return readFileSync(path);
    } catch (err) {
      throw new Error(`${flag}: ${(err as Error).message}`);
    }
  };
  opts.tls = {
    ca: v.ca === undefined ? undefined : read("--coordd-tls-ca", v.ca),
    cert: v.cert === undefined ? undefined : read("--coordd-tls-cert", v.cert),
    key: v.key === undefined ? undefined : read("--coordd-tls-key", v.key),
  };
  return opts;
}

// parseDuration reads "30s", "1500ms", "2m" or plain seconds, in ms.
function parseDuration(s: string): number {
  const m = /^(-?\d+(?:\.\d+)?)(ms|s|m)?$/.exec(s.trim());
  if (!m) return NaN;
  return Number(m[1]) * { ms: 1, s: 1000, m: 60_000 }[m[2] ?? "s"]!;
}

async function main(): Promise<void> {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        coordd: { type: "string", default: DEFAULT_ADDR },
        "mdn-base": { type: "string", default: DEFAULT_MDN_BASE },
        timeout: { type: "string", default: "30s" },
        "coordd-token": { type: "string", default: process.env["COORDD_TOKEN"] ?? "" },
        "coordd-tls": { type: "boolean", default: false },
        "coordd-tls-ca": { type: "string" },
        "coordd-tls-cert": { type: "string" },
        "coordd-tls-key": { type: "string" },
        http: { type: "string" },
        "allowed-origins": { type: "string", default: process.env["MDN_MCP_ALLOWED_ORIGINS"] ?? "" },
        "drain-delay": { type: "string", default: "0s" },
        "shutdown-grace": { type: "string", default: "10s" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n${USAGE}`);
    process.exit(2);
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return;
  }
  const timeoutMs = parseDuration(values.timeout);
  if (!(timeoutMs > 0)) {
    process.stderr.write(`--timeout ${JSON.stringify(values.timeout)}: want a positive duration such as 30s\n`);
    process.exit(2);
  }
  const drainDelayMs = parseDuration(values["drain-delay"]);
  const graceMs = parseDuration(values["shutdown-grace"]);
  if (!(drainDelayMs >= 0) || !(graceMs > 0)) {
    process.stderr.write(`--drain-delay ${values["drain-delay"]}, --shutdown-grace ${values["shutdown-grace"]}: want >= 0 and > 0\n`);
    process.exit(2);
  }
  let allowedOrigins: Set<string>;
  try {
    allowedOrigins = parseOrigins(values["allowed-origins"]);
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n`);
    process.exit(2);
  }
  let listen: { host: string | undefined; port: number } | undefined;
  if (values.http !== undefined) {
    const m = /^(.*):(\d+)$/.exec(values.http);
    if (!m || Number(m[2]) > 65535) {
      process.stderr.write(`--http ${JSON.stringify(values.http)}: want host:port or :port\n`);
      process.exit(2);
    }
    listen = { host: m[1] === "" ? undefined : m[1]!.replace(/^\[(.*)\]$/, "$1"), port: Number(m[2]) };
  }
  let security: ClientOptions;
  try {
    security = securityOptions({
      token: values["coordd-token"],
      tls: values["coordd-tls"],
      ca: values["coordd-tls-ca"],
      cert: values["coordd-tls-cert"],
      key: values["coordd-tls-key"],
    });
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n`);
    process.exit(2);
  }
  const coordd = new CoorddClient(values.coordd, { ...security, timeoutMs });
  let mdn: MDN;
  try {
    mdn = new MDN(coordd, values["mdn-base"]);
  } catch (err) {
    process.stderr.write(`--mdn-base: ${(err as Error).message}\n`);
    process.exit(2);
  }
  if (listen) {
    const log = (line: string) => process.stderr.write(line + "\n");
    let http;
    try {
      http = await serveHTTP(
        { host: listen.host ?? "", port: listen.port, token: process.env["MDN_MCP_TOKEN"] || undefined, allowedOrigins, drainDelayMs, graceMs, log },
        () => newServer(mdn),
      );
    } catch (err) {
      process.stderr.write(`--http: ${(err as Error).message}\n`);
      process.exit(1);
    }
    log(`mdn-mcp: coordd ${coordd.addr}, MDN ${mdn.base.href}`);
    const stop = () => {
      void http.drain().then((ok) => {
        coordd.close();
        process.exit(ok ? 0 : 1);
      });
    };
    process.once("SIGTERM", stop);
    process.once("SIGINT", stop);
    return;
  }
  const server = newServer(mdn);
  // stdout carries the protocol: anything else goes to stderr.
  server.server.onclose = () => coordd.close();
  await server.connect(new StdioServerTransport());
  process.stderr.write(`mdn-mcp: serving on stdio; coordd ${coordd.addr}, MDN ${mdn.base.href}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`mdn-mcp: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
