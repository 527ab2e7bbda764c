package gateway

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/coordd/coordd/internal/upstream"
)

// Server is one backend MCP server (mcp_servers in coordd's
// configuration; docs/gateway.md documents each field): a command coordd
// runs and speaks to over stdio, or the url of a remote Streamable HTTP
// server.
type Server struct {
	// Name is the server's name: agents reach it at /mcp/NAME.
	Name string `yaml:"name"`
	// Command starts a stdio server: the program and its arguments.
	Command []string `yaml:"command"`
	// Env is added to the command's environment: plain values, or
	// secrets read from an environment variable or a file.
	Env map[string]EnvValue `yaml:"env"`
	// Processes is the size of the shared pool of processes per
	// credential scope. 0: one process per agent session, nothing shared
	// (for servers that keep state, such as a browser or a shell).
	Processes int `yaml:"processes"`
	// Coalesce names the tools whose identical calls share one execution.
	Coalesce []string `yaml:"coalesce"`
	// TrustReadOnly coalesces every tool the server annotates
	// readOnlyHint. Annotations are the server's hints, so: false.
	TrustReadOnly bool `yaml:"trust_read_only"`
	// TTL keeps a coalesced call's result this long (L1 and L2). 0:
	// identical calls in flight share one execution, nothing is kept.
	TTL time.Duration `yaml:"ttl"`
	// StaleTTL is how long past TTL a kept result may be served stale
	// (while it is refreshed, or instead of an error). Default: 24h.
	StaleTTL time.Duration `yaml:"stale_ttl"`
	// URL is a remote Streamable HTTP server's endpoint.
	URL string `yaml:"url"`
	// Credential is sent to a remote server on every request.
	Credential *upstream.Credential `yaml:"credential"`
	// Timeout bounds one call to the server. Default: 60s.
	Timeout time.Duration `yaml:"timeout"`
	// InitTimeout bounds starting a server and its initialize. Default: 30s.
	InitTimeout time.Duration `yaml:"init_timeout"`
	// MaxResultBytes bounds a tool call's result; a larger one fails the
	// call with a tool error. Default: 10 MiB.
	MaxResultBytes int64 `yaml:"max_result_bytes"`
	// Protection is the rate limit, slots in flight, retries and breaker
	// towards the server, as an upstream has them.
	Protection upstream.Protection `yaml:",inline"`
}

// EnvValue is one environment variable of a stdio server: a plain value,
// or a secret from value_env or value_file.
type EnvValue struct {
	Value     string `yaml:"value"`
	ValueEnv  string `yaml:"value_env"`
	ValueFile string `yaml:"value_file"`
}

// UnmarshalYAML takes a scalar as a plain value.
func (e *EnvValue) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		e.Value = n.Value
		return nil
	}
	type plain EnvValue
	var p plain
	dec := n.Decode(&p)
	*e = EnvValue(p)
	return dec
}

// Secret reports whether the value is a secret, read from elsewhere.
func (e EnvValue) Secret() bool { return e.ValueEnv != "" || e.ValueFile != "" }

// load returns the value. Errors name field and the variable or file,
// never the value.
func (e EnvValue) load(field string) (string, error) {
	n := 0
	for _, s := range []string{e.ValueEnv, e.ValueFile} {
		if s != "" {
			n++
		}
	}
	switch {
	case n > 1 || (n == 1 && e.Value != ""):
		return "", fmt.Errorf("%s: set one of value, value_env and value_file", field)
	case e.ValueEnv != "":
		v, ok := os.LookupEnv(e.ValueEnv)
		if !ok {
			return "", fmt.Errorf("%s.value_env: the environment variable %s is not set", field, e.ValueEnv)
		}
		return v, nil
	case e.ValueFile != "":
		b, err := os.ReadFile(e.ValueFile)
		if err != nil {
			return "", fmt.Errorf("%s.value_file: %s cannot be read", field, e.ValueFile)
		}
		return strings.TrimSuffix(string(b), "\n"), nil
	}
	return e.Value, nil
}

// loadEnv loads every value of env, in the form exec.Cmd.Env takes.
func loadEnv(field string, env map[string]EnvValue) (map[string]string, error) {
	out := make(map[string]string, len(env))
	var errs []error
	for k, v := range env {
		if !envName.MatchString(k) {
			errs = append(errs, fmt.Errorf("%s.%s: not an environment variable name", field, k))
			continue
		}
		s, err := v.load(field + "." + k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if strings.ContainsRune(s, 0) {
			errs = append(errs, fmt.Errorf("%s.%s: the value holds a NUL byte", field, k))
			continue
		}
		out[k] = s
	}
	return out, errors.Join(errs...)
}

var (
	envName    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	serverName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
)

// Defaults.
const (
	DefaultTimeout     = 60 * time.Second
	DefaultInitTimeout = 30 * time.Second
	// MaxArgumentBytes bounds a call's arguments, canonical.
	MaxArgumentBytes = 1 << 20
	// maxBodyBytes bounds a request body an agent sends.
	maxBodyBytes = MaxArgumentBytes + 64<<10
)

// check validates s, naming field.
func (s *Server) check(field string) error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(field+format, args...)) }
	if !serverName.MatchString(s.Name) {
		add(".name: %q must match %s (agents reach it at /mcp/NAME)", s.Name, serverName)
	}
	switch {
	case len(s.Command) > 0 && s.URL != "":
		add(": set command (a stdio server) or url (a remote one), not both")
	case len(s.Command) == 0 && s.URL == "":
		add(": set command (a stdio server) or url (a remote one)")
	case s.URL != "":
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add(".url: %q is not an http(s) url", s.URL)
		}
		if s.Processes != 0 {
			add(".processes: a remote server has no processes")
		}
		if len(s.Env) > 0 {
			add(".env: a remote server has no environment")
		}
	default:
		if s.Credential != nil {
			add(".credential: a stdio server takes its secrets from env")
		}
		if s.Processes < 0 {
			add(".processes: %d; want 1 or more, or absent for one process per agent session", s.Processes)
		}
		if s.Processes == 0 && (len(s.Coalesce) > 0 || s.TrustReadOnly) {
			add(".coalesce: a server with one process per agent session shares nothing; set processes for a shared pool")
		}
	}
	if s.TTL < 0 {
		add(".ttl: %v is negative", s.TTL)
	}
	if s.Timeout < 0 || s.InitTimeout < 0 {
		add(".timeout: negative")
	}
	if s.MaxResultBytes < 0 {
		add(".max_result_bytes: negative")
	}
	return errors.Join(errs...)
}

func (s *Server) setDefaults() {
	if s.Timeout == 0 {
		s.Timeout = DefaultTimeout
	}
	if s.InitTimeout == 0 {
		s.InitTimeout = DefaultInitTimeout
	}
	if s.MaxResultBytes == 0 {
		s.MaxResultBytes = 10 << 20
	}
}

// Resolved returns servers with every default filled in, as New and
// the engine use them (for --check-config).
func Resolved(servers []Server) []Server {
	out := make([]Server, len(servers))
	for i, s := range servers {
		s.setDefaults()
		if s.Protection.RateLimit == 0 {
			s.Protection.RateLimit = -1
		}
		u := upstream.Config{StaleTTL: s.StaleTTL, Protection: s.Protection}
		upstream.SetDefaults(&u)
		s.StaleTTL, s.Protection = u.StaleTTL, u.Protection
		out[i] = s
	}
	return out
}

// coalesces reports whether tool's calls may share an execution, given
// whether the server annotated it readOnlyHint.
func (s *Server) coalesces(tool string, readOnly bool) bool {
	for _, t := range s.Coalesce {
		if t == tool {
			return true
		}
	}
	return s.TrustReadOnly && readOnly
}
