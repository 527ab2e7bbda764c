package main

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// cacheHintsSince is the first MCP version whose list results carry the
// cache hints ttlMs and cacheScope (and require them).
const cacheHintsSince = "2026-07-28"

// listToolsResult is tools/list's result as MCP versions up to 2025-11-25
// define it (ListToolsResult: tools, nextCursor, _meta).
type listToolsResult struct {
	mcp.ResultBase
	NextCursor string      `json:"nextCursor,omitempty"`
	Tools      []*mcp.Tool `json:"tools"`
}

// toolsListByVersion is receiving middleware that answers a tools/list of
// a session on a version before cacheHintsSince with that version's
// result. The go-sdk sends ttlMs and cacheScope whatever the version;
// they mean nothing before 2026-07-28, and the TypeScript server, whose
// SDK speaks up to 2025-11-25, sends neither: testdata/mcp-golden/tools.json
// holds both servers to the one shape a 2025-11-25 client gets. Clients
// on 2026-07-28 and later keep the go-sdk's result, hints included.
func toolsListByVersion(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		full, ok := res.(*mcp.ListToolsResult)
		if err != nil || !ok {
			return res, err
		}
		if r, ok := req.(*mcp.ListToolsRequest); !ok || r.ProtocolVersion() >= cacheHintsSince {
			return res, nil
		}
		return &listToolsResult{ResultBase: mcp.ResultBase{Meta: full.Meta}, NextCursor: full.NextCursor, Tools: full.Tools}, nil
	}
}
