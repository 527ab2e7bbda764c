import { readFileSync } from "node:fs";

/** VERSION is the version the MCP server reports, in --version and to MCP
 * clients, as the Go server (cmd/mdn-mcp) does: "v" and package.json's
 * version, which says what internal/version/VERSION says (cmd/mdn-mcp's
 * TestOneVersion checks both). Read at run time from the package's own
 * package.json (../../ from dist/mcp/), so that there is one place to
 * change it. */
export const VERSION: string =
  "v" + (JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string }).version;
