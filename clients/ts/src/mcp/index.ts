// Package entry "@coordd/client/mcp": the MDN MCP server as a library, for a
// program that serves the tools its own way (another transport, another
// process layout). It is an entry of its own so that importing the client
// ("@coordd/client") loads neither the MCP SDK nor zod. The command is
// server.js (the package's bin, coordd-mdn-mcp).

export { newServer } from "./tools.js";
export { DEFAULT_MDN_BASE, MDN, SEARCH_RESULTS, type Getter } from "./mdn.js";
export { MCP_PATH, parseOrigins, serveHTTP, type HTTPOptions, type HTTPServer } from "./http.js";
