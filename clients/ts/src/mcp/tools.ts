// The MCP tools mdn_doc and mdn_search, the same as the Go server's
// (cmd/mdn-mcp): names, descriptions, input schemas and texts.

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { ListToolsRequestSchema, type CallToolResult, type ListToolsResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

import { MDN, SEARCH_RESULTS } from "./mdn.js";
import { VERSION } from "./version.js";

const annotations = { readOnlyHint: true, idempotentHint: true, openWorldHint: true };

/** The tools' definitions; the input schemas are strict (no extra
 * properties: additionalProperties false), as the Go server's are. */
const TOOLS = {
  mdn_doc: {
    title: "Read an MDN page",
    description:
      "Returns an MDN Web Docs page as markdown: title, summary, and every section " +
      "(syntax, parameters, examples, specifications). Takes the page's path, e.g. /en-US/docs/Web/API/Fetch_API.",
    inputSchema: z
      .object({
        path: z.string().describe("the page's path on MDN, e.g. /en-US/docs/Web/JavaScript/Reference/Global_Objects/Array/map"),
      })
      .strict(),
    annotations,
  },
  mdn_search: {
    title: "Search MDN",
    description: `Searches MDN Web Docs and returns the top ${SEARCH_RESULTS} pages with their paths (for mdn_doc) and summaries.`,
    inputSchema: z.object({ query: z.string().describe("what to search for, e.g. array map") }).strict(),
    annotations,
  },
};

/** newServer returns an MCP server whose tools read MDN through mdn: the
 * same tools as the Go server (cmd/mdn-mcp). */
export function newServer(mdn: MDN): McpServer {
  const server = new McpServer(
    { name: "mdn-mcp", title: "MDN Web Docs", version: VERSION },
    {
      instructions: "Read MDN Web Docs pages. Use mdn_search to find a page's path, then mdn_doc to read it.",
      // As the Go SDK declares by default: clients may set a log level.
      capabilities: { logging: {} },
    },
  );
  server.registerTool("mdn_doc", TOOLS.mdn_doc, ({ path }) => guard(() => mdn.doc(path)));
  server.registerTool("mdn_search", TOOLS.mdn_search, ({ query }) => guard(() => mdn.search(query)));
  // tools/list answers what MCP 2025-11-25, the newest version this SDK
  // speaks, defines for a tool, as the Go server does
  // (testdata/mcp-golden/tools.json), in place of the SDK's listing. That
  // stamps each input schema "$schema": draft-07, a dialect a 2025-11-25
  // client need not support (without $schema a schema is 2020-12, which
  // every client must; clients that validate with 2020-12 only refuse the
  // tool), and adds execution.taskSupport "forbidden", which is what its
  // absence means. setRequestHandler replaces the SDK's handler.
  server.server.setRequestHandler(ListToolsRequestSchema, (): ListToolsResult => ({
    tools: Object.entries(TOOLS).map(([name, t]) => ({
      name,
      title: t.title,
      description: t.description,
      inputSchema: inputSchema(t.inputSchema),
      annotations: t.annotations,
    })),
  }));
  return server;
}

/** inputSchema is schema as JSON Schema 2020-12, MCP's default dialect,
 * left unstated: no $schema. */
function inputSchema(schema: z.ZodObject): ListToolsResult["tools"][number]["inputSchema"] {
  const { $schema: _, ...rest } = z.toJSONSchema(schema, { target: "draft-2020-12", io: "input" });
  return rest as ListToolsResult["tools"][number]["inputSchema"];
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
