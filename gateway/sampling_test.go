// Sampling is deprecated from protocol 2026-07-28 (SEP-2577), but it is
// part of every version the gateway speaks, and servers use it.
//
//lint:file-ignore SA1019 the gateway carries sampling for the protocol versions it speaks

package gateway_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// samplingAgent connects an agent that answers sampling requests with
// its own name, counting them.
func samplingAgent(t *testing.T, url, name string, asked *atomic.Int64) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			asked.Add(1)
			return &mcp.CreateMessageResult{Content: &mcp.TextContent{Text: "sampled by " + name}, Model: "model-of-" + name, Role: "assistant"}, nil
		},
	})
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
