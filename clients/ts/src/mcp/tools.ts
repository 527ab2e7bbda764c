// The MCP tools mdn_doc and mdn_search, the same as the Go server's
// (cmd/mdn-mcp): names, descriptions, input schemas and texts.

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

import { MDN, SEARCH_RESULTS } from "./mdn.js";

/** newServer returns an MCP server whose tools read MDN through mdn: the
 * same tools as the Go server (cmd/mdn-mcp). */
export function newServer(mdn: MDN): McpServer {
  const server = new McpServer(
    { name: "mdn-mcp", title: "MDN Web Docs", version: "0.1.0" },
    {
      instructions: "Read MDN Web Docs pages. Use mdn_search to find a page's path, then mdn_doc to read it.",
      // As the Go SDK declares by default: clients may set a log level.
      capabilities: { logging: {} },
    },
  );
  const annotations = { readOnlyHint: true, idempotentHint: true, openWorldHint: true };
  server.registerTool(
    "mdn_doc",
    {
      title: "Read an MDN page",
      description:
        "Returns an MDN Web Docs page as markdown: title, summary, and every section " +
        "(syntax, parameters, examples, specifications). Takes the page's path, e.g. /en-US/docs/Web/API/Fetch_API.",
      // strict: no extra properties (additionalProperties: false), as the Go server's schema.
      inputSchema: z
        .object({
          path: z
            .string()
            .describe("the page's path on MDN, e.g. /en-US/docs/Web/JavaScript/Reference/Global_Objects/Array/map"),
        })
        .strict(),
      annotations,
    },
    ({ path }) => guard(() => mdn.doc(path)),
  );
  server.registerTool(
    "mdn_search",
    {
      title: "Search MDN",
      description: `Searches MDN Web Docs and returns the top ${SEARCH_RESULTS} pages with their paths (for mdn_doc) and summaries.`,
      inputSchema: z.object({ query: z.string().describe("what to search for, e.g. array map") }).strict(),
      annotations,
    },
    ({ query }) => guard(() => mdn.search(query)),
  );
  return server;
}

// guard turns an unexpected exception (a bug, or data in a shape nobody
// foresaw) into a tool error too, with the reason, instead of leaving it to
// the SDK's generic message.
async function guard(f: () => Promise<CallToolResult>): Promise<CallToolResult> {
  try {
    return await f();
  } catch (err) {
    return { content: [{ type: "text", text: `internal error: ${String(err)}` }], isError: true };
  }
}

