package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/fakegitlab"
	"github.com/coordd/coordd/internal/testing/mcpservers"
)

// TestTypeScriptAgents: agents of the official TypeScript SDK (node,
// testdata/ts-agents.mjs), 20 per instance of 3, call the same allowed
// tool at once: one execution, one API request, every agent the same
// answer.
func TestTypeScriptAgents(t *testing.T) {
	sdk := mcpservers.TypeScriptSDK(t)
	api := fakegitlab.Start(t)
	in := fleet(t, 3, []gateway.Server{gitlab(t, api, 1, time.Minute)}, gateway.Options{})
	release := api.Hold()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const per = 20
	outs := make([][]byte, len(in))
	errs := make([]error, len(in))
	var wg sync.WaitGroup
	for i, inst := range in {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, "node", "testdata/ts-agents.mjs", inst.url+"/mcp/gitlab", "get_file_contents",
				`{"project_id":"9","file_path":"ts.md"}`, "20")
			cmd.Env = append(os.Environ(), "MCP_SDK="+sdk)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			outs[i], errs[i] = cmd.Output()
			if errs[i] != nil {
				t.Logf("node: %s", stderr.String())
			}
		})
	}
	waitFor(t, func() bool { return sum(in, func(c *counts) int64 { return c.calls.Load() }) == int64(per*len(in)) })
	release()
	wg.Wait()
	var texts []string
	for i, out := range outs {
		if errs[i] != nil {
			t.Fatalf("instance %d's agents: %v", i, errs[i])
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			var r struct {
				Text    string `json:"text"`
				IsError bool   `json:"isError"`
				Error   string `json:"error"`
			}
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Error != "" || r.IsError {
				t.Fatalf("an agent: %s (%v)", sc.Text(), err)
			}
			texts = append(texts, r.Text)
		}
	}
	if len(texts) != per*len(in) {
		t.Fatalf("%d answers; want %d", len(texts), per*len(in))
	}
	for _, s := range texts {
		if s != texts[0] || !strings.Contains(s, "contents of ts.md") {
			t.Fatalf("answers differ or lack the file: %q, %q", s, texts[0])
		}
	}
	if n := sum(in, func(c *counts) int64 { return c.executions.Load() }); n != 1 || api.Files() != 1 {
		t.Fatalf("executions %d, API requests %d; want 1, 1", n, api.Files())
	}
}
