package main

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/upstream"
	"github.com/coordd/coordd/server"
	"github.com/coordd/coordd/server/statuspage"
)

// tenantCredential is one entry of a tenant's credentials: an upstream's
// (or a remote MCP server's) credential, or a stdio MCP server's
// environment ({VAR: value, VAR: {value_env: X}}): a mapping whose keys
// are not those of a credential is an environment.
type tenantCredential struct {
	upstream.Credential
	env map[string]gateway.EnvValue
}

func (c *tenantCredential) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i < len(n.Content); i += 2 {
			switch n.Content[i].Value {
			case "header", "value_env", "value_file":
			default:
				return n.Decode(&c.env)
			}
		}
	}
	return n.Decode(&c.Credential)
}

// MarshalYAML prints the entry as it was written (--check-config).
func (c tenantCredential) MarshalYAML() (any, error) {
	if c.env != nil {
		return c.env, nil
	}
	return c.Credential, nil
}

// mcpServerNames are the names of fc's MCP servers.
func (fc *fileConfig) mcpServerNames() []string {
	var n []string
	for _, s := range fc.MCPServers {
		n = append(n, s.Name)
	}
	return n
}

// newGateway builds the MCP gateway of fc, nil without mcp_servers. Its
// errors name the fields, one per line.
func (fc *fileConfig) newGateway(log *slog.Logger, rdb redis.UniversalClient, keyPrefix string) (*gateway.Gateway, error) {
	if len(fc.MCPServers) == 0 {
		if fc.MCPListen != "" {
			return nil, errors.New("config: mcp_listen: set, but no mcp_servers are configured")
		}
		return nil, nil
	}
	var errs []error
	if fc.MCPListen == "" {
		errs = append(errs, errors.New("config: mcp_servers: set, but mcp_listen is not (the address agents reach the gateway at)"))
	}
	opt := gateway.Options{Logger: log, AllowedOrigins: fc.MCPAllowedOrigins, KeyPrefix: keyPrefix}
	if rdb != nil {
		opt.Redis = rdb
	}
	names := fc.mcpServerNames()
	if len(fc.Tenants) > 0 {
		tenants, err := fc.tenants(fc.upstreamNames(), names, log)
		errs = append(errs, splitErrors(err)...)
		if err == nil {
			a, err := server.NewAuth(tenants)
			if err != nil {
				errs = append(errs, fmt.Errorf("config: %w", err))
			} else {
				opt.Authenticate = a.Tenant
			}
		}
		for i, tc := range fc.Tenants {
			field := fmt.Sprintf("config: tenants[%d] (%s)", i, tc.Name)
			gt := gateway.Tenant{Name: tc.Name, Servers: tc.MCPServers, Env: map[string]map[string]gateway.EnvValue{}, Credentials: map[string]*upstream.Credential{}}
			if tc.Weight != nil {
				gt.Weight = *tc.Weight
			}
			for _, name := range slices.Sorted(maps.Keys(tc.Credentials)) {
				c := tc.Credentials[name]
				if !slices.Contains(names, name) {
					continue // an upstream's (tenants)
				}
				cf := fmt.Sprintf("%s.credentials.%s", field, name)
				switch {
				case !slices.Contains(tc.MCPServers, name):
					errs = append(errs, fmt.Errorf("%s: the tenant is not granted MCP server %q (mcp_servers)", cf, name))
				case c == nil:
					errs = append(errs, fmt.Errorf("%s: empty", cf))
				case c.env != nil:
					gt.Env[name] = c.env
				default:
					if err := c.Credential.Load(cf, log); err != nil {
						errs = append(errs, err)
						continue
					}
					gt.Credentials[name] = &c.Credential
				}
			}
			opt.Tenants = append(opt.Tenants, gt)
		}
	}
	gw, err := gateway.New(fc.MCPServers, opt)
	for _, e := range splitErrors(err) {
		errs = append(errs, fmt.Errorf("config: %w", e))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return gw, nil
}

// gatewayStatus is the status page's view of gw.
func gatewayStatus(gw *gateway.Gateway) func() []statuspage.MCPServerView {
	return func() []statuspage.MCPServerView {
		var out []statuspage.MCPServerView
		for _, s := range gw.Status() {
			v := statuspage.MCPServerView{Name: s.Name, Transport: s.Transport, Target: s.Target, Shared: s.Shared, Coalesce: s.Coalesce,
				TrustReadOnly: s.TrustRO, TTLSeconds: s.TTL, Sessions: s.Sessions, Protocol: s.Protocol, Executions: s.Calls, Pools: []statuspage.MCPPoolView{}}
			for _, p := range s.Pools {
				v.Pools = append(v.Pools, statuspage.MCPPoolView{Scope: p.Scope, Live: p.Live, Size: p.Size})
			}
			out = append(out, v)
		}
		return out
	}
}
