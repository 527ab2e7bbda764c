// ts-agents.mjs URL TOOL ARGS_JSON N: N agents of the official
// TypeScript MCP SDK, each its own session over Streamable HTTP, call
// TOOL with ARGS_JSON at once; prints one JSON line per agent:
// {"text": ..., "isError": ...} or {"error": ...}. The SDK is found at
// $MCP_SDK (the package directory).
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [url, tool, argsJSON, n] = process.argv.slice(2);
const sdk = process.env.MCP_SDK;
const { Client } = await import(pathToFileURL(join(sdk, "dist/esm/client/index.js")).href);
const { StreamableHTTPClientTransport } = await import(pathToFileURL(join(sdk, "dist/esm/client/streamableHttp.js")).href);

async function agent(i) {
  const client = new Client({ name: `ts-agent-${i}`, version: "1" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  try {
    const r = await client.callTool({ name: tool, arguments: JSON.parse(argsJSON) });
    return { text: r.content.map((c) => c.text ?? "").join(""), isError: !!r.isError };
  } finally {
    await client.close();
  }
}

const results = await Promise.all(Array.from({ length: Number(n) }, (_, i) => agent(i).catch((e) => ({ error: String(e) }))));
for (const r of results) console.log(JSON.stringify(r));
