package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/gateway"
)

// fileConfig is coordd's YAML configuration: the coordinator's own
// (coordinator.Config, whose yaml tags name its keys: one definition, so
// that its validation errors name the file's keys), and the fields only
// the coordd binary has: listeners, Redis, logging, shutdown, security.
// docs/configuration.md documents each field.
type fileConfig struct {
	coordinator.Config `yaml:",inline"`

	Listen        string          `yaml:"listen"`
	Redis         string          `yaml:"redis"`
	RedisCluster  []string        `yaml:"redis_cluster"`
	RedisSentinel *sentinelConfig `yaml:"redis_sentinel"`
	LogLevel      string          `yaml:"log_level"`
	LogFormat     string          `yaml:"log_format"`     // text or json. Default: text.
	MetricsListen string          `yaml:"metrics_listen"` // Prometheus /metrics address. Default: none.
	HTTPListen    string          `yaml:"http_listen"`    // the HTTP door's address (server.GRPC.HTTPHandler). Default: none.
	MCPListen     string          `yaml:"mcp_listen"`     // the MCP gateway's address (Streamable HTTP at /mcp/NAME). Default: none.
	// MCPServers are the backend MCP servers the gateway fronts
	// (docs/gateway.md). Default: none.
	MCPServers []gateway.Server `yaml:"mcp_servers"`
	// MCPAllowedOrigins are the Origins (scheme://host[:port]) from which
	// a browser page may call the gateway, beside its own loopback one.
	// Default: none.
	MCPAllowedOrigins []string      `yaml:"mcp_allowed_origins"`
	ShutdownGrace     time.Duration `yaml:"shutdown_grace"`
	DrainDelay        time.Duration `yaml:"drain_delay"`

	// MaxConcurrentCalls caps the calls in progress (server.Config).
	// Default (0): 10000. Negative: no cap.
	MaxConcurrentCalls int `yaml:"max_concurrent_calls"`

	// MetricsAuth gives the metrics listener (/metrics, /status,
	// /debug/pprof) tokens of its own; required with tenants.
	MetricsAuth *metricsAuthConfig `yaml:"metrics_auth"`
	// Pprof serves net/http/pprof under /debug/pprof/ on the metrics
	// listener. Default: false.
	Pprof bool `yaml:"pprof"`
	// Tracing exports OpenTelemetry traces (tracing.go). Default: off.
	Tracing tracingConfig `yaml:"tracing"`

	securityConfig `yaml:",inline"`
}

// sentinelConfig finds the Redis master through Redis Sentinel, and
// follows it across failovers.
type sentinelConfig struct {
	// MasterName is the name the sentinels monitor the master under. Required.
	MasterName string `yaml:"master_name"`
	// Addrs are the sentinels' host:port addresses. Required.
	Addrs []string `yaml:"addrs"`
	// Password authenticates to the master and replicas. Default: none.
	Password string `yaml:"password"`
	// SentinelPassword authenticates to the sentinels, when they require
	// it. Default: none.
	SentinelPassword string `yaml:"sentinel_password"`
}

// validateRedis names the bad field of fc's Redis settings.
func (fc *fileConfig) validateRedis() error {
	if fc.Redis != "" && len(fc.RedisCluster) > 0 {
		return errors.New("config: redis, redis_cluster: set only one (redis may come from --redis or COORDD_REDIS): " +
			"a single Redis or the seeds of a Redis Cluster")
	}
	sc := fc.RedisSentinel
	if sc == nil {
		return nil
	}
	switch {
	case fc.Redis != "" || len(fc.RedisCluster) > 0:
		return errors.New("config: redis_sentinel: set only one of redis (or --redis), redis_cluster and redis_sentinel")
	case sc.MasterName == "":
		return errors.New("config: redis_sentinel.master_name: required")
	case len(sc.Addrs) == 0:
		return errors.New("config: redis_sentinel.addrs: required (the sentinels' host:port)")
	}
	return nil
}

// readConfig parses YAML, refusing unknown fields so that a typo names
// itself instead of being ignored. Its error lists every problem, each
// naming the key path and line it is at (decodeYAML).
func readConfig(r io.Reader) (fileConfig, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return fileConfig{}, fmt.Errorf("config: %w", err)
	}
	return decodeConfig(b, "")
}

// decodeConfig decodes b, the configuration file path ("" if none). It
// returns what decoded beside the error, one line a problem
// (errors.Join): "config: FILE: line 5: upstreams[1].ttl: …".
func decodeConfig(b []byte, path string) (fileConfig, error) {
	var fc fileConfig
	var errs []error
	for _, err := range decodeYAML(b, &fc) {
		var ye *yamlError
		switch {
		case path == "":
			err = fmt.Errorf("config: %w", err)
		case errors.As(err, &ye):
			err = fmt.Errorf("config: %s:%d: %s: %s", path, ye.line, ye.path, ye.msg)
		default:
			err = fmt.Errorf("config: %s: %w", path, err)
		}
		errs = append(errs, err)
	}
	return fc, errors.Join(errs...)
}

func loadConfigFile(path string) (fileConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return fileConfig{}, fmt.Errorf("config: %w", err)
	}
	return decodeConfig(b, path)
}

// addUpstreamFlag applies one --upstream NAME=BASE_URL: it overrides the
// base URL of a configured upstream of that name, or adds one.
func (fc *fileConfig) addUpstreamFlag(v string) error {
	name, base, ok := strings.Cut(v, "=")
	if !ok || name == "" || base == "" {
		return fmt.Errorf("--upstream %q: want NAME=BASE_URL", v)
	}
	for i := range fc.Upstreams {
		if fc.Upstreams[i].Name == name {
			fc.Upstreams[i].BaseURL = base
			return nil
		}
	}
	fc.Upstreams = append(fc.Upstreams, coordinator.Upstream{Name: name, BaseURL: base})
	return nil
}

// upstreamNames are the names of the upstreams coordd will serve: the
// configured ones, or the default.
func (fc *fileConfig) upstreamNames() []string {
	if len(fc.Upstreams) == 0 {
		return []string{coordinator.DefaultUpstream().Name}
	}
	names := make([]string, len(fc.Upstreams))
	for i, u := range fc.Upstreams {
		names[i] = u.Name
	}
	return names
}

// logUpstreams logs the upstreams in force, each as name=base_url, and
// where they come from (from, as options.upstreamsFrom): configured ones
// replace the default rather than join it, which a user who adds one with
// --upstream may not expect, so the line says so and names the default.
func logUpstreams(log *slog.Logger, ups []coordinator.Upstream, from string) {
	d := coordinator.DefaultUpstream()
	if len(ups) == 0 {
		log.Info("upstreams in force", "upstreams", []string{d.Name + "=" + d.BaseURL}, "source", "default")
		return
	}
	list := make([]string, len(ups))
	for i, u := range ups {
		list[i] = u.Name + "=" + u.BaseURL
	}
	log.Info("upstreams in force; they replace the default", "upstreams", list, "source", from, "default", d.Name+"="+d.BaseURL)
}

// coordinatorConfig is the coordinator's part of the configuration,
// checked as coordinator.New checks it: the error names every bad field
// by its key, one per line (errors.Join).
func (fc *fileConfig) coordinatorConfig() (coordinator.Config, error) {
	_, err := fc.Config.Resolved()
	var errs []error
	for _, e := range splitErrors(err) {
		errs = append(errs, fmt.Errorf("config: %w", e))
	}
	return fc.Config, errors.Join(errs...)
}
