// Security: the client and the MCP server against a real coordd that
// serves mutual TLS and requires a tenant's bearer token.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";

import { Code, ConnectError, CoorddClient, UnreachableError } from "../client.js";
import { MAP_PATH, mapPage, searchResults } from "./fixtures.js";
import { makeCerts, SERVER_JS, startCoordd, startFakeMDN, type Certs, type Coordd, type FakeMDN } from "./harness.js";

const TOKEN = "ts-agents-token-0123456789";

let mdn: FakeMDN;
let coordd: Coordd;
let certs: Certs;

before(async () => {
  certs = await makeCerts();
  mdn = await startFakeMDN({ pages: { [MAP_PATH]: mapPage }, search: searchResults });
  coordd = await startCoordd(
    { mdn: mdn.base },
    {
      config: `tls:
  cert_file: ${certs.serverCert}
  key_file: ${certs.serverKey}
  client_ca_file: ${certs.caFile}
tenants:
  - name: agents
    tokens_env: COORDD_TS_TEST_TOKENS
    upstreams: [mdn]
`,
      env: { COORDD_TS_TEST_TOKENS: TOKEN },
    },
  );
});

after(async () => {
  await coordd?.stop();
  await mdn?.close();
});

async function rejection(p: Promise<unknown>): Promise<ConnectError> {
  const err = await p.then(
    () => assert.fail("resolved; want a rejection"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ConnectError, `got ${String(err)}; want a ConnectError`);
  return err;
}

test("TLS, a client certificate and a token: served; without the token or the certificate: refused", async () => {
  const url = `${mdn.base}${MAP_PATH}/index.json`;
  const tls = { ca: certs.read(certs.caFile), cert: certs.read(certs.clientCert), key: certs.read(certs.clientKey) };
  const once = { retry: { attempts: 1 }, timeoutMs: 5000 };
  const cases: { name: string; client: CoorddClient; want?: Code; unreachable?: boolean }[] = [
    { name: "token and client certificate", client: new CoorddClient(coordd.addr, { tls, token: TOKEN }) },
    { name: "no token", client: new CoorddClient(coordd.addr, { tls }), want: Code.Unauthenticated },
    { name: "wrong token", client: new CoorddClient(coordd.addr, { tls, token: TOKEN + "x" }), want: Code.Unauthenticated },
    {
      name: "no client certificate",
      client: new CoorddClient(coordd.addr, { ...once, tls: { ca: tls.ca }, token: TOKEN }),
      want: Code.Unavailable,
      unreachable: true,
    },
    {
      name: "untrusted server certificate",
      client: new CoorddClient(coordd.addr, { ...once, tls: { cert: tls.cert, key: tls.key }, token: TOKEN }),
      want: Code.Unavailable,
      unreachable: true,
    },
  ];
  for (const c of cases) {
    try {
      if (c.want === undefined) {
        const doc = await c.client.get(url);
        assert.deepEqual(JSON.parse(doc.text()), mapPage, c.name);
      } else {
        const err = await rejection(c.client.get(url));
        assert.equal(Code[err.code], Code[c.want], `${c.name}: ${err.message}`);
        assert.equal(err instanceof UnreachableError, c.unreachable ?? false, `${c.name}: ${err.message}`);
      }
    } finally {
      c.client.close();
    }
  }
  assert.equal(mdn.requests(`${MAP_PATH}/index.json`), 1);
});

test("the MCP server takes the token from $COORDD_TOKEN and TLS from flags", async () => {
  for (const { token, ok } of [
    { token: TOKEN, ok: true },
    { token: "", ok: false },
  ]) {
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [SERVER_JS, "--coordd", coordd.addr, "--mdn-base", mdn.base, "--timeout", "5s",
        "--coordd-tls-ca", certs.caFile, "--coordd-tls-cert", certs.clientCert, "--coordd-tls-key", certs.clientKey],
      env: { ...(process.env as Record<string, string>), COORDD_TOKEN: token },
      stderr: "pipe",
    });
    const client = new Client({ name: "coordd-ts-test", version: "0.0.0" });
    await client.connect(transport);
    try {
      const r = (await client.callTool({ name: "mdn_doc", arguments: { path: MAP_PATH } })) as CallToolResult;
      const text = r.content.map((c) => (c.type === "text" ? c.text : "")).join("");
      if (ok) {
        assert.equal(r.isError, undefined, text);
        assert.match(text, /^# Array\.prototype\.map\(\)/);
      } else {
        assert.equal(r.isError, true, text);
        assert.match(text, /requires a valid token: set \$COORDD_TOKEN or --coordd-token/);
      }
    } finally {
      await client.close();
    }
  }
});
