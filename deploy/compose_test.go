package deploy

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose loads docker-compose.yml as `docker compose config` would,
// with the compose-spec loader (schema validation included, so an unknown
// key fails), every profile enabled.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, "docker-compose.yml")}},
		Environment: types.Mapping{},
	}, loader.WithProfiles([]string{"*"}))
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return p
}

// flagValue returns the value of --name=V or --name V in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// TestCompose: Redis, three coordd instances on it behind HAProxy, which
// publishes the gRPC port, and the MCP server pointed at HAProxy; the
// images come from the Dockerfile's stages.
func TestCompose(t *testing.T) {
	p := loadCompose(t)
	want := []string{"coordd-1", "coordd-2", "coordd-3", "haproxy", "mcp-lb", "mdn-mcp", "mdn-mcp-1", "mdn-mcp-2", "mdn-mcp-3", "redis"}
	if got := p.ServiceNames(); !slices.Equal(sortedCopy(got), want) {
		t.Fatalf("services = %v; want %v", got, want)
	}
	for _, name := range []string{"coordd-1", "coordd-2", "coordd-3"} {
		t.Run(name, func(t *testing.T) {
			s := p.Services[name]
			if s.Build == nil || s.Build.Target != "coordd" {
				t.Errorf("build = %+v; want the Dockerfile's coordd target", s.Build)
			}
			r, _ := flagValue(s.Command, "redis")
			u, err := url.Parse(r)
			if err != nil || u.Scheme != "redis" || u.Hostname() != "redis" {
				t.Errorf("--redis %q; want redis://redis:...", r)
			}
			if _, ok := s.DependsOn["redis"]; !ok {
				t.Errorf("depends_on = %v; want redis", s.DependsOn)
			}
			if l, _ := flagValue(s.Command, "listen"); l != ":50051" {
				t.Errorf("--listen %q; want :50051", l)
			}
			dd, _ := flagValue(s.Command, "drain-delay")
			delay, err := time.ParseDuration(dd)
			if err != nil {
				t.Errorf("--drain-delay %q: %v", dd, err)
			}
			const shutdownGrace = 10 * time.Second // coordd's default
			if s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) <= delay+shutdownGrace {
				t.Errorf("stop_grace_period %v; want more than drain_delay %v + shutdown_grace %v", s.StopGracePeriod, delay, shutdownGrace)
			}
			if len(s.Ports) != 0 {
				t.Errorf("ports %v; want none: clients go through HAProxy", s.Ports)
			}
		})
	}

	h := p.Services["haproxy"]
	if !slices.ContainsFunc(h.Ports, func(pc types.ServicePortConfig) bool { return pc.Target == 50051 && pc.Published == "50051" }) {
		t.Errorf("haproxy ports = %+v; want 50051 published", h.Ports)
	}
	var cfgMounted bool
	for _, v := range h.Volumes {
		if v.Target == "/usr/local/etc/haproxy/haproxy.cfg" && v.Source == filepath.Join(p.WorkingDir, "deploy/haproxy/haproxy.cfg") {
			cfgMounted = true
		}
	}
	if !cfgMounted {
		t.Errorf("haproxy volumes = %+v; want deploy/haproxy/haproxy.cfg on /usr/local/etc/haproxy/haproxy.cfg", h.Volumes)
	}
	// HAProxy balances over exactly the coordd services, on the port they
	// listen on, and binds the port it publishes.
	cfg := readFile(t, "haproxy/haproxy.cfg")
	var servers []string
	for _, m := range regexp.MustCompile(`(?m)^\s*server\s+\S+\s+(\S+)`).FindAllStringSubmatch(cfg, -1) {
		servers = append(servers, m[1])
	}
	if want := []string{"coordd-1:50051", "coordd-2:50051", "coordd-3:50051"}; !slices.Equal(servers, want) {
		t.Errorf("haproxy.cfg servers = %v; want %v", servers, want)
	}
	if !regexp.MustCompile(`(?m)^\s*bind\s+:50051\s*$`).MatchString(cfg) {
		t.Error("haproxy.cfg: no `bind :50051`")
	}
	if !regexp.MustCompile(`(?m)^\s*mode\s+tcp\s*$`).MatchString(cfg) {
		t.Error("haproxy.cfg: not in TCP mode")
	}

	m := p.Services["mdn-mcp"]
	if m.Build == nil || m.Build.Target != "mdn-mcp" {
		t.Errorf("mdn-mcp build = %+v; want the Dockerfile's mdn-mcp target", m.Build)
	}
	if a, _ := flagValue(m.Command, "coordd"); a != "haproxy:50051" {
		t.Errorf("mdn-mcp --coordd %q; want haproxy:50051", a)
	}
	if !m.StdinOpen {
		t.Error("mdn-mcp: stdin_open false; it speaks MCP on stdin")
	}
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestComposeMCPFleet: three replicas of the MCP server over Streamable
// HTTP, each calling coordd through HAProxy, behind mcp-lb: HAProxy in HTTP
// mode with deploy/haproxy/mcp.cfg, round robin over exactly those
// replicas on the port they listen on, checking /healthz, and publishing
// its frontend; each replica's stop grace outlasts its drain.
func TestComposeMCPFleet(t *testing.T) {
	p := loadCompose(t)
	replicas := []string{"mdn-mcp-1", "mdn-mcp-2", "mdn-mcp-3"}
	var port string
	for _, name := range replicas {
		t.Run(name, func(t *testing.T) {
			s := p.Services[name]
			if s.Build == nil || s.Build.Target != "mdn-mcp" {
				t.Errorf("build = %+v; want the Dockerfile's mdn-mcp target", s.Build)
			}
			h, ok := flagValue(s.Command, "http")
			if !ok || !strings.HasPrefix(h, ":") {
				t.Errorf("--http %q; want :PORT, every interface", h)
			}
			port = strings.TrimPrefix(h, ":")
			if a, _ := flagValue(s.Command, "coordd"); a != "haproxy:50051" {
				t.Errorf("--coordd %q; want haproxy:50051", a)
			}
			dd, _ := flagValue(s.Command, "drain-delay")
			sg, _ := flagValue(s.Command, "shutdown-grace")
			delay, err1 := time.ParseDuration(dd)
			grace, err2 := time.ParseDuration(sg)
			if err1 != nil || err2 != nil {
				t.Fatalf("--drain-delay %q, --shutdown-grace %q: %v %v", dd, sg, err1, err2)
			}
			if s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) <= delay+grace {
				t.Errorf("stop_grace_period %v; want more than --drain-delay %v + --shutdown-grace %v", s.StopGracePeriod, delay, grace)
			}
			if _, ok := s.Environment["MDN_MCP_TOKEN"]; !ok {
				t.Errorf("environment %v; want MDN_MCP_TOKEN passed through", s.Environment)
			}
			if len(s.Ports) != 0 {
				t.Errorf("ports %v; want none: MCP clients go through mcp-lb", s.Ports)
			}
		})
	}

	lb := p.Services["mcp-lb"]
	var mounted bool
	for _, v := range lb.Volumes {
		if v.Target == "/usr/local/etc/haproxy/haproxy.cfg" && v.Source == filepath.Join(p.WorkingDir, "deploy/haproxy/mcp.cfg") {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("mcp-lb volumes = %+v; want deploy/haproxy/mcp.cfg on /usr/local/etc/haproxy/haproxy.cfg", lb.Volumes)
	}
	cfg := readFile(t, "haproxy/mcp.cfg")
	var servers []string
	for _, m := range regexp.MustCompile(`(?m)^\s*server\s+\S+\s+(\S+)`).FindAllStringSubmatch(cfg, -1) {
		servers = append(servers, m[1])
	}
	var want []string
	for _, r := range replicas {
		want = append(want, r+":"+port)
	}
	if !slices.Equal(servers, want) {
		t.Errorf("mcp.cfg servers = %v; want %v", servers, want)
	}
	bind := regexp.MustCompile(`(?m)^\s*bind\s+:(\d+)\s*$`).FindStringSubmatch(cfg)
	if bind == nil {
		t.Fatal("mcp.cfg: no `bind :PORT`")
	}
	if !slices.ContainsFunc(lb.Ports, func(pc types.ServicePortConfig) bool { return fmt.Sprint(pc.Target) == bind[1] && pc.Published != "" }) {
		t.Errorf("mcp-lb ports = %+v; want %s published", lb.Ports, bind[1])
	}
	for _, re := range []string{`(?m)^\s*mode\s+http\s*$`, `(?m)^\s*balance\s+roundrobin\s*$`, `(?m)^\s*option\s+httpchk\s+GET\s+/healthz\s*$`} {
		if !regexp.MustCompile(re).MatchString(cfg) {
			t.Errorf("mcp.cfg: no line matching %s", re)
		}
	}
	for _, re := range []string{`(?m)^\s*(cookie|stick|hash-type|balance\s+source)`} {
		if regexp.MustCompile(re).MatchString(cfg) {
			t.Errorf("mcp.cfg: session affinity (%s); the replicas are stateless", re)
		}
	}
}
