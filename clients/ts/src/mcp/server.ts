#!/usr/bin/env node
// Command server is an MCP server offering mdn_doc and mdn_search, which
// read MDN through coordd instead of fetching it themselves. It speaks MCP
// on stdio, or with --http serves MCP Streamable HTTP at /mcp, stateless,
// as the Go server (cmd/mdn-mcp) does.
//
//	coordd-mdn-mcp [--coordd HOST:PORT] [--mdn-base URL] [--timeout DURATION]
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
import { VERSION } from "./version.js";

/** NAME is the command's name as installed: package.json's bin. */
const NAME = "coordd-mdn-mcp";

/** OPTIONS are the flags, for parseArgs. The defaults of --coordd-token and
 * --allowed-origins come from the environment (ENV_DEFAULTS), after
 * parsing. */
const OPTIONS = {
  "allowed-origins": { type: "string" },
  coordd: { type: "string", default: DEFAULT_ADDR },
  "coordd-tls": { type: "boolean", default: false },
  "coordd-tls-ca": { type: "string" },
  "coordd-tls-cert": { type: "string" },
  "coordd-tls-key": { type: "string" },
  "coordd-token": { type: "string" },
  "drain-delay": { type: "string", default: "0s" },
  http: { type: "string" },
  "mdn-base": { type: "string", default: DEFAULT_MDN_BASE },
  "shutdown-grace": { type: "string", default: "10s" },
  timeout: { type: "string", default: "30s" },
  version: { type: "boolean", default: false },
  help: { type: "boolean", short: "h" },
} as const;

/** ENV_DEFAULTS are the environment variables that default flags. */
const ENV_DEFAULTS = { "allowed-origins": "MDN_MCP_ALLOWED_ORIGINS", "coordd-token": "COORDD_TOKEN" } as const;

/** HELP is each flag's line in the usage: its argument, and its text, in
 * the words of the Go server's (cmd/mdn-mcp), which cmd/mdn-mcp's
 * TestUsage compares. */
const HELP: Record<Exclude<keyof typeof OPTIONS, "help">, { arg?: string; text: string }> = {
  "allowed-origins": {
    arg: "ORIGINS",
    text:
      "with --http: comma-separated origins (scheme://host[:port]) of browser front-ends admitted at /mcp; " +
      "a request with any other Origin header gets 403 (default $MDN_MCP_ALLOWED_ORIGINS, else none)",
  },
  coordd: { arg: "ADDRESS", text: "coordd's gRPC address: host:port" },
  version: { text: "print the version and build facts, then exit" },
  "coordd-tls": { text: "dial coordd over TLS, trusting the system's roots" },
  "coordd-tls-ca": { arg: "FILE", text: "dial coordd over TLS, trusting the CAs in this PEM file" },
  "coordd-tls-cert": {
    arg: "FILE",
    text: "client certificate PEM file, for a coordd that requires one (mutual TLS); with --coordd-tls-key",
  },
  "coordd-tls-key": { arg: "FILE", text: "the client certificate's key PEM file; with --coordd-tls-cert" },
  "coordd-token": {
    arg: "TOKEN",
    text: "bearer token for a coordd that requires one (default $COORDD_TOKEN, which keeps it out of sight of ps)",
  },
  "drain-delay": {
    arg: "DURATION",
    text: "with --http: how long /healthz answers 503 after SIGTERM before the listener closes, for the balancer to notice",
  },
  http: {
    arg: "ADDR",
    text:
      "serve MCP Streamable HTTP at http://ADDR/mcp (host:port, or :port for every interface) instead of stdio, " +
      "stateless; MCP clients must send $MDN_MCP_TOKEN as a bearer token if it is set",
  },
  "mdn-base": { arg: "URL", text: "MDN's base URL; coordd must have it as an upstream" },
  "shutdown-grace": { arg: "DURATION", text: "with --http: how long requests in flight may run once the listener is closed" },
  timeout: {
    arg: "DURATION",
    text: "deadline of one tool call's fetch through coordd, retries included, such as 30s, 1500ms or 2m",
  },
};

const USAGE_HEAD = `usage: ${NAME} [flags]

An MCP server for assistants: its tools mdn_doc (an MDN Web Docs page as
markdown) and mdn_search (MDN's search) read MDN through coordd, so that
many assistants asking for the same page cost MDN one request.

Transports:
  stdio            the default: MCP on stdin and stdout; logs go to stderr
  Streamable HTTP  with --http ADDR: MCP at http://ADDR/mcp, stateless (any
                   replica answers any request), with /healthz, draining on
                   SIGTERM

Flags:
`;

const USAGE_TAIL = `  --help, -h
        print this usage, then exit

Environment:
  COORDD_TOKEN             the default of --coordd-token, out of sight of ps
  MDN_MCP_ALLOWED_ORIGINS  the default of --allowed-origins
  MDN_MCP_TOKEN            with --http: the bearer token MCP clients must send
                           at /mcp; unset, none is asked for
`;

/** usage is --help's text, laid out as the Go server's (cmd/mdn-mcp's
 * writeUsage): the flags in name order, each text wrapped at 80 columns
 * with its default. */
function usage(): string {
  const indent = "        ";
  let out = USAGE_HEAD;
  for (const name of (Object.keys(HELP) as (keyof typeof HELP)[]).sort()) {
    const { arg, text } = HELP[name];
    const def = (OPTIONS[name] as { default?: string | boolean }).default;
    out += `  --${name}${arg ? ` ${arg}` : ""}\n`;
    const full = def === undefined || def === false || def === "" ? text : `${text} (default ${def})`;
    for (const line of wrap(full, 80 - indent.length)) out += `${indent}${line}\n`;
  }
  return out + USAGE_TAIL;
}

/** wrap breaks text into lines of at most width characters at spaces; a
 * word longer than width has a line of its own. */
function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  let line = "";
  for (const word of text.split(/\s+/).filter(Boolean)) {
    if (line === "") line = word;
    else if (line.length + 1 + word.length <= width) line += ` ${word}`;
    else {
      lines.push(line);
      line = word;
    }
  }
  if (line !== "") lines.push(line);
  return lines;
}

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
    ({ values } = parseArgs({ options: OPTIONS, strict: true, allowPositionals: false }));
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n${usage()}`);
    process.exit(2);
  }
  if (values.help) {
    process.stdout.write(usage());
    return;
  }
  if (values.version) {
    process.stdout.write(`${NAME} ${VERSION} (node ${process.version} ${process.platform}/${process.arch})\n`);
    return;
  }
  for (const [flag, env] of Object.entries(ENV_DEFAULTS) as [keyof typeof ENV_DEFAULTS, string][]) {
    values[flag] ??= process.env[env];
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
    allowedOrigins = parseOrigins(values["allowed-origins"] ?? "");
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
      token: values["coordd-token"] ?? "",
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
    const log = (line: string) => process.stderr.write(`${NAME}: ${line}\n`);
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
    log(`coordd ${coordd.addr}, MDN ${mdn.base.href}`);
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
  process.stderr.write(`${NAME}: serving on stdio; coordd ${coordd.addr}, MDN ${mdn.base.href}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`${NAME}: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
