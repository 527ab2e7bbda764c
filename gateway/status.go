package gateway

import (
	"net/url"
	"sort"
)

// ServerStatus is what the status page shows of one server.
type ServerStatus struct {
	Name      string       `json:"name"`
	Transport string       `json:"transport"` // stdio or remote
	Target    string       `json:"target"`    // the command's program, or the url
	Shared    bool         `json:"shared"`    // a pool per credential scope; false: a process per agent session
	Coalesce  []string     `json:"coalesce"`
	TrustRO   bool         `json:"trust_read_only"`
	TTL       float64      `json:"ttl_seconds"`
	Pools     []PoolStatus `json:"pools"`
	Sessions  int          `json:"sessions"` // agent sessions open on this instance
	Protocol  string       `json:"protocol"` // the version agreed with the server last; "" before any
	Calls     int64        `json:"executions"`
}

// PoolStatus is one credential scope's pool: how many of its processes
// (or its remote session) are up, of how many.
type PoolStatus struct {
	Scope string `json:"scope"` // "default" (the server's own credential), else a digest naming the scope
	Live  int    `json:"live"`
	Size  int    `json:"size"`
}

// Status returns the servers and their pools on this instance, in
// configuration order. It names credential scopes by a digest, never by
// a secret.
func (g *Gateway) Status() []ServerStatus {
	sessions := map[string]int{}
	g.sessions.mu.Lock()
	for _, se := range g.sessions.m {
		sessions[se.server]++
	}
	g.sessions.mu.Unlock()
	var out []ServerStatus
	for _, name := range g.order {
		b := g.servers[name]
		st := ServerStatus{Name: name, Transport: "stdio", Shared: b.shared(), Coalesce: append([]string{}, b.cfg.Coalesce...),
			TrustRO: b.cfg.TrustReadOnly, TTL: b.cfg.TTL.Seconds(), Sessions: sessions[name], Calls: b.executions.Load(), Pools: []PoolStatus{}}
		if v := b.version.Load(); v != nil {
			st.Protocol = *v
		}
		if b.cfg.URL != "" {
			st.Transport, st.Target = "remote", b.cfg.URL
			if u, err := url.Parse(b.cfg.URL); err == nil {
				u.User = nil // a password in the url is a secret
				st.Target = u.Redacted()
			}
		} else {
			st.Target = b.cfg.Command[0]
		}
		b.mu.Lock()
		for id, p := range b.pools {
			ps := PoolStatus{Scope: "default", Size: len(p.slots)}
			if id != "" {
				ps.Scope = "scope " + id[:8]
			}
			for _, s := range p.slots {
				s.mu.Lock()
				if s.c != nil && s.c.alive() {
					ps.Live++
				}
				s.mu.Unlock()
			}
			st.Pools = append(st.Pools, ps)
		}
		b.mu.Unlock()
		sort.Slice(st.Pools, func(i, j int) bool { return st.Pools[i].Scope < st.Pools[j].Scope })
		out = append(out, st)
	}
	return out
}
