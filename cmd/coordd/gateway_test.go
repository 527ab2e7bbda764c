package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakegitlab"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/mcpservers"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// TestGatewayFromConfig runs coordd from a configuration with
// mcp_servers and tenants, as docs/gateway.md gives it: an agent of
// team-a reaches the reference GitLab MCP server at /mcp/gitlab with
// team-a's own GitLab token (a canary); the gRPC door does not serve the
// gateway's upstreams; and the canary is nowhere but in the GitLab API's
// requests: not in the log (at debug), --check-config's output, or
// Redis.
func TestGatewayFromConfig(t *testing.T) {
	const (
		canary  = "glpat-CANARYteamA0123456789"
		tenantA = "gateway-team-a-token-0123456789"
	)
	gitlabCmd := mcpservers.Command(t, "mcp-server-gitlab")
	api := fakegitlab.Start(t)
	rs := redistest.Start(t)
	t.Setenv("TEAM_A_GITLAB_TOKEN", canary)
	t.Setenv("OPERATOR_GITLAB_TOKEN", "glpat-operator-0123456789")
	t.Setenv("GATEWAY_SCOPE_KEY", "gateway-scope-key-0123456789")
	dir := t.TempDir()
	addr, maddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg := fmt.Sprintf(`listen: %s
mcp_listen: %s
metrics_listen: %s
metrics_auth: {tokens: [gateway-metrics-token-0123456789]}
redis: %s
log_level: debug
credential_scope_key_env: GATEWAY_SCOPE_KEY
mcp_servers:
  - name: gitlab
    command: [%q, %q]
    env: {GITLAB_API_URL: %s, GITLAB_PERSONAL_ACCESS_TOKEN: {value_env: OPERATOR_GITLAB_TOKEN}}
    processes: 2
    coalesce: [get_file_contents]
    ttl: 60s
tenants:
  - name: team-a
    tokens: [%s]
    upstreams: ["*"]
    mcp_servers: [gitlab]
    credentials:
      gitlab: {GITLAB_PERSONAL_ACCESS_TOKEN: {value_env: TEAM_A_GITLAB_TOKEN}}
`, addr, maddr, metricsAddr, rs.URL(), gitlabCmd[0], gitlabCmd[1], api.URL, tenantA)
	path := filepath.Join(dir, "coordd.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	checkOut, err := os.Create(filepath.Join(dir, "check.out"))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"--config", path, "--check-config"}, checkOut); err != nil {
		t.Fatalf("--check-config: %v", err)
	}
	checkOut.Close()
	logFile, err := os.Create(filepath.Join(dir, "coordd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--config", path, "--drain-delay", "1ms"}, logFile) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cctx, ccancel := context.WithTimeout(ctx, time.Minute)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	enginetest.WaitFor(t, time.Minute, "the MCP listener", func() bool {
		c, err := net.Dial("tcp", maddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	s, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: "http://" + maddr + "/mcp/gitlab", HTTPClient: &http.Client{Transport: bearerTransport{token: tenantA, next: http.DefaultTransport}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tools, err := s.ListTools(cctx, nil)
	if err != nil || len(tools.Tools) == 0 {
		t.Fatalf("tools/list: %v, %d tools", err, len(tools.Tools))
	}
	var answers strings.Builder
	for range 3 {
		r, err := s.CallTool(cctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: map[string]any{"project_id": "7", "file_path": "a.md"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range r.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				answers.WriteString(tc.Text)
			}
		}
		if r.IsError {
			t.Fatalf("tool error: %s", answers.String())
		}
	}
	if !strings.Contains(answers.String(), fakegitlab.Owner(canary)) {
		t.Fatalf("answers %q are not team-a's (%s)", answers.String(), fakegitlab.Owner(canary))
	}
	if n := api.FilesBy(canary); n != 1 {
		t.Fatalf("requests with team-a's token = %d; want 1 (then the cache)", n)
	}

	// The gRPC door does not serve the gateway's upstreams, even to a
	// tenant granted every upstream.
	g := coorddv1.NewCoordinatorServiceClient(cc)
	_, err = fleettest.Get(metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+tenantA), g,
		&coorddv1.GetOrFetchRequest{Url: "http://gitlab.mcp.invalid/tools/call/get_file_contents?a=0"})
	if status.Code(err) != codes.PermissionDenied && status.Code(err) != codes.InvalidArgument {
		t.Fatalf("gRPC GetOrFetch of a gateway url: %v; want a refusal", err)
	}

	// The metrics and the status page count the calls and show the pools.
	scrape := func(path string) string {
		req, _ := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+metricsAddr+path, nil)
		req.Header.Set("Authorization", "Bearer gateway-metrics-token-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	metrics, page := scrape("/metrics"), scrape("/status.json")
	for _, want := range []string{
		`coordd_mcp_calls_total{server="gitlab",tool="get_file_contents"} 3`,
		`coordd_mcp_executions_total{server="gitlab",tool="get_file_contents"} 1`,
		`coordd_mcp_served_total{server="gitlab",source="l1",tool="get_file_contents"} 2`,
		`coordd_mcp_processes{server="gitlab"} 2`, // initialize, tools/list and the call went round the pool
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var st struct {
		MCP []struct {
			Name  string `json:"name"`
			Pools []struct {
				Scope      string `json:"scope"`
				Live, Size int
			} `json:"pools"`
		} `json:"mcp_servers"`
	}
	if err := json.Unmarshal([]byte(page), &st); err != nil || len(st.MCP) != 1 || st.MCP[0].Name != "gitlab" || len(st.MCP[0].Pools) != 1 || st.MCP[0].Pools[0].Live != 2 || st.MCP[0].Pools[0].Size != 2 {
		t.Errorf("/status.json's mcp_servers = %+v (%v); want gitlab with team-a's pool, 2 of 2 live", st.MCP, err)
	}
	// Where the canary must not be.
	// The tenant's environment travels inside the process as base64 JSON
	// (gateway's envHeader): that form must not leak either.
	env := base64.StdEncoding.EncodeToString([]byte(`{"GITLAB_PERSONAL_ACCESS_TOKEN":"` + canary + `"}`))
	look := func(where, text string) {
		if strings.Contains(text, canary) || strings.Contains(text, "CANARYteamA") || strings.Contains(text, env) {
			t.Errorf("team-a's GitLab token found in %s", where)
		}
	}
	rdb := rs.Client(t)
	keys, err := rdb.Keys(cctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		look("a Redis key", k)
		if v, err := rdb.Dump(cctx, k).Result(); err == nil {
			look("Redis value of "+k, v)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	done <- nil
	look("/metrics", metrics)
	look("/status.json", page)
	for _, f := range []string{"coordd.log", "check.out"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		look(f, string(b))
	}
}

// TestGatewayDocExample: the configuration docs/gateway.md opens with,
// as written, with the variables it names set, passes --check-config;
// and its rate written 20/s is 20 a second.
func TestGatewayDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i := strings.Index(s, "```yaml\n")
	j := strings.Index(s[i+8:], "```")
	if i < 0 || j < 0 {
		t.Fatal("docs/gateway.md has no yaml block")
	}
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(s[i+8:i+8+j]), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"GITHUB_TOKEN": "ghp_doc", "DOCS_MCP_TOKEN": "Bearer doc", "TEAM_A_TOKENS": "team-a-token-0123456789abcdef", "TEAM_A_GITHUB_TOKEN": "ghp_team_a"} {
		t.Setenv(k, v)
	}
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := run(context.Background(), []string{"--config", path, "--check-config"}, out); err != nil {
		t.Fatalf("docs/gateway.md's configuration: %v", err)
	}
	fc, err := loadConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fc.MCPServers[1].Protection.RateLimit; got != 20 {
		t.Fatalf("rate_limit: 20/s decoded as %d", got)
	}
}
