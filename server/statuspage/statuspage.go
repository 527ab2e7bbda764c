// Package statuspage serves a coordd instance's live status: /status, an
// HTML page rendered by the server (html/template) that refreshes itself
// from /status.json every 1.5 seconds with a small inline script, and
// /status.json, the same data for scripts. The page needs no build step
// and loads nothing from elsewhere, so it works offline and under a strict
// Content-Security-Policy.
//
// It lives under internal/, beside server/metrics, as wiring for the
// coordd binary's metrics listener (cmd/coordd); the data comes from
// coordinator.Coordinator.Status, which knows nothing of HTML.
package statuspage

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/upstream"
)

// Source is what the page shows; *coordinator.Coordinator is one.
type Source interface {
	Status(ctx context.Context) coordinator.Status
}

// Paths served by Handler.
const (
	PagePath = "/status"
	JSONPath = "/status.json"
)

// RefreshEvery is how often the page fetches JSONPath.
const RefreshEvery = 1500 * time.Millisecond

// readTimeout bounds the Redis reads of one Status (the shared guards), so
// that a page refresh never hangs on a frozen Redis; the coordinator's own
// Redis timeout applies within it.
const readTimeout = 2 * time.Second

// Handler serves PagePath and JSONPath from src. instance names the
// instance in the page's title (its gRPC address, say); log receives
// rendering errors.
func Handler(src Source, instance string, log *slog.Logger, opts ...Option) http.Handler {
	h := &handler{src: src, instance: instance, log: log}
	for _, o := range opts {
		o(h)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PagePath, h.page)
	mux.HandleFunc("GET "+JSONPath, h.json)
	return mux
}

type handler struct {
	src      Source
	instance string
	log      *slog.Logger
	mcp      func() []MCPServerView
}

// Option adds to what the page shows.
type Option func(*handler)

// WithMCPServers shows the MCP gateway's servers and pools, from servers.
func WithMCPServers(servers func() []MCPServerView) Option {
	return func(h *handler) { h.mcp = servers }
}

func (h *handler) view(r *http.Request) View {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	v := NewView(h.src.Status(ctx), h.instance)
	if h.mcp != nil {
		v.MCPServers = h.mcp()
	}
	return v
}

// security headers: everything is inline and same-origin.
func secure(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:")
}

func (h *handler) json(w http.ResponseWriter, r *http.Request) {
	secure(w)
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(h.view(r)); err != nil {
		h.log.Debug("status.json: write failed", "err", err)
	}
}

func (h *handler) page(w http.ResponseWriter, r *http.Request) {
	secure(w)
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, h.view(r)); err != nil {
		h.log.Error("status page: template failed", "err", err)
		http.Error(w, "status page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(b.Bytes())
}

// View is the page's data, and /status.json's document. Durations are in
// seconds; a null means unknown or undefined (a ratio without requests).
type View struct {
	Instance  string         `json:"instance"`
	Now       time.Time      `json:"now"`
	Flights   []FlightView   `json:"flights"`
	Upstreams []UpstreamView `json:"upstreams"`
	Quotas    []QuotaView    `json:"quotas"`
	Redis     RedisView      `json:"redis"`
	L1        L1View         `json:"l1"`
	Windows   []WindowView   `json:"windows"`
	Tenants   []TenantView   `json:"tenants"`
	// MCPServers are the MCP gateway's servers (WithMCPServers); empty
	// without a gateway.
	MCPServers []MCPServerView `json:"mcp_servers"`
}

// MCPServerView is one server of the MCP gateway, on this instance.
type MCPServerView struct {
	Name          string        `json:"name"`
	Transport     string        `json:"transport"` // stdio or remote
	Target        string        `json:"target"`    // the program, or the url
	Shared        bool          `json:"shared"`    // a pool per credential scope; false: a process per agent session
	Coalesce      []string      `json:"coalesce"`
	TrustReadOnly bool          `json:"trust_read_only"`
	TTLSeconds    float64       `json:"ttl_seconds"`
	Sessions      int           `json:"sessions"`
	Protocol      string        `json:"protocol"`   // the version agreed with the server
	Executions    int64         `json:"executions"` // calls run on the server
	Pools         []MCPPoolView `json:"pools"`
}

// MCPPoolView is one credential scope's processes (or remote session).
type MCPPoolView struct {
	Scope string `json:"scope"`
	Live  int    `json:"live"`
	Size  int    `json:"size"`
}

// FlightView is a flight in progress (coordinator.FlightStatus).
type FlightView struct {
	ID                 string  `json:"id"`
	Key                string  `json:"key"` // the cache key (or url), shortened
	Upstream           string  `json:"upstream"`
	Tenant             string  `json:"tenant"`
	Role               string  `json:"role"`
	Stage              string  `json:"stage"`
	Detail             string  `json:"detail"`
	AgeSeconds         float64 `json:"age_seconds"`
	Waiters            int     `json:"waiters"`
	FollowersElsewhere *int    `json:"followers_elsewhere"`
	Stale              bool    `json:"serving_stale"`
}

// UpstreamView is an upstream's guard (coordinator.UpstreamStatus).
type UpstreamView struct {
	Name             string  `json:"name"`
	Scope            string  `json:"scope"`
	Breaker          string  `json:"breaker"`
	NextProbeSeconds float64 `json:"next_probe_seconds"`
	RateLimit        int     `json:"rate_limit"` // per second; 0: none
	Burst            int     `json:"burst"`
	FreeSlots        *int    `json:"free_slots"` // null: no limit
	NextSlotSeconds  float64 `json:"next_slot_seconds"`
	BackoffSeconds   float64 `json:"backoff_seconds"`
	// InFlight is the requests in flight, by Scope's count, over every
	// credential scope; InFlightScopes the scopes holding one, and
	// InFlightBusiest the most one of them holds, of MaxInFlight (0: no
	// cap).
	InFlight        int `json:"in_flight"`
	InFlightScopes  int `json:"in_flight_scopes"`
	InFlightBusiest int `json:"in_flight_busiest"`
	MaxInFlight     int `json:"max_in_flight"`
	RetryBudget     struct {
		Left          int     `json:"left"`
		Requests      int     `json:"requests"`
		Retries       int     `json:"retries"`
		WindowSeconds float64 `json:"window_seconds"`
	} `json:"retry_budget"`
}

// QuotaView is a quota learned from an upstream's answers
// (upstream.QuotaStatus): whose credential it counts, never the
// credential.
type QuotaView struct {
	Upstream     string  `json:"upstream"`
	Whose        string  `json:"whose"`     // "upstream", "tenant NAME", "caller", "no credential"
	Partition    string  `json:"partition"` // "" the default
	Source       string  `json:"source"`    // the header it was read from
	Limit        int64   `json:"limit"`     // per window; 0: not said
	Remaining    int64   `json:"remaining"` // after the slots booked
	ResetSeconds float64 `json:"reset_seconds"`
	AgeSeconds   float64 `json:"age_seconds"` // since the last answer that announced it
}

// RedisView is coordinator.RedisStatus.
type RedisView struct {
	Mode    string `json:"mode"`
	Healthy bool   `json:"healthy"`
	Downs   int64  `json:"downs"`
}

// L1View is coordinator.L1Stats; the hit ratio is in each window. Bytes
// is the memory reserved, of MaxBytes; DocumentBytes, what the Entries
// documents take of it.
type L1View struct {
	Bytes         int64 `json:"bytes"`
	MaxBytes      int64 `json:"max_bytes"`
	DocumentBytes int64 `json:"document_bytes"`
	Entries       int   `json:"entries"`
	Evicted       int64 `json:"evicted"`
	Expired       int64 `json:"expired"`
}

// WindowView is a rolling window (coordinator.WindowStatus).
type WindowView struct {
	Span              string   `json:"span"`
	SpanSeconds       float64  `json:"span_seconds"`
	Calls             int64    `json:"calls"`
	Errors            int64    `json:"errors"`
	L1Hits            int64    `json:"l1_hits"`
	UpstreamRequests  int64    `json:"upstream_requests"`
	ServedPerUpstream *float64 `json:"served_per_upstream_request"`
	L1HitRatio        *float64 `json:"l1_hit_ratio"`
}

// TenantView is coordinator.TenantStatus; the default tenant is "".
type TenantView struct {
	Tenant           string `json:"tenant"`
	Calls            int64  `json:"calls"`
	UpstreamRequests int64  `json:"upstream_requests"`
}

// shortenAt is the longest key shown whole.
const shortenAt = 96

// shorten keeps s's head and tail around an ellipsis, on rune boundaries.
func shorten(s string) string {
	r := []rune(s)
	if len(r) <= shortenAt {
		return s
	}
	return string(r[:shortenAt/2-1]) + "…" + string(r[len(r)-shortenAt/2:])
}

// NewView turns a coordinator.Status into the page's data.
func NewView(s coordinator.Status, instance string) View {
	v := View{
		Instance:   instance,
		Now:        s.Now,
		Flights:    []FlightView{},
		Upstreams:  []UpstreamView{},
		MCPServers: []MCPServerView{},
		Windows:    []WindowView{},
		Tenants:    []TenantView{},
		Redis:      RedisView{Mode: s.Redis.Mode, Healthy: s.Redis.Healthy, Downs: s.Redis.Downs},
		L1: L1View{
			Bytes: s.L1.Bytes, MaxBytes: s.L1.MaxBytes, DocumentBytes: s.L1.DocumentBytes, Entries: s.L1.Entries,
			Evicted: s.L1.Evicted, Expired: s.L1.Expired,
		},
	}
	for _, f := range s.Flights {
		fv := FlightView{
			ID: f.ID, Key: shorten(f.Key), Upstream: f.Upstream, Tenant: f.Tenant, Role: f.Role, Stage: f.Stage,
			Detail: f.Detail, AgeSeconds: f.Age.Seconds(), Waiters: f.Waiters, Stale: f.Stale,
		}
		if f.FollowersElsewhere >= 0 {
			fv.FollowersElsewhere = &f.FollowersElsewhere
		}
		v.Flights = append(v.Flights, fv)
	}
	v.Quotas = []QuotaView{}
	for _, u := range s.Upstreams {
		v.Upstreams = append(v.Upstreams, upstreamView(u.Name, u.Guard))
		for _, q := range u.Guard.Quotas {
			v.Quotas = append(v.Quotas, QuotaView{Upstream: u.Name, Whose: q.Label, Partition: q.Partition, Source: q.Source,
				Limit: q.Limit, Remaining: q.Remaining, ResetSeconds: q.Reset.Seconds(), AgeSeconds: q.Age.Seconds()})
		}
	}
	for _, w := range s.Windows {
		wv := WindowView{
			Span: spanName(w.Span), SpanSeconds: w.Span.Seconds(), Calls: w.Calls, Errors: w.Errors,
			L1Hits: w.L1, UpstreamRequests: w.Upstream,
		}
		if r, ok := w.ServedPerUpstream(); ok {
			wv.ServedPerUpstream = &r
		}
		if r, ok := w.L1HitRatio(); ok {
			wv.L1HitRatio = &r
		}
		v.Windows = append(v.Windows, wv)
	}
	for _, t := range s.Tenants {
		v.Tenants = append(v.Tenants, TenantView{Tenant: t.Tenant, Calls: t.Calls, UpstreamRequests: t.Upstream})
	}
	return v
}

func upstreamView(name string, g coordinator.GuardStatus) UpstreamView {
	u := UpstreamView{
		Name: name, Scope: g.Scope, Breaker: g.Breaker, NextProbeSeconds: g.NextProbe.Seconds(),
		RateLimit: g.RateLimit, Burst: g.Burst, NextSlotSeconds: g.NextSlot.Seconds(), BackoffSeconds: g.Backoff.Seconds(),
		InFlight: g.InFlight.Held, InFlightScopes: g.InFlight.Scopes, InFlightBusiest: g.InFlight.Busiest, MaxInFlight: g.MaxInFlight,
	}
	if g.FreeSlots >= 0 {
		u.FreeSlots = &g.FreeSlots
	}
	u.RetryBudget.Left, u.RetryBudget.Requests, u.RetryBudget.Retries = g.RetriesLeft, g.Requests, g.Retries
	u.RetryBudget.WindowSeconds = upstream.RetryBudgetWindow.Seconds()
	return u
}

func spanName(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%dm", int(d/time.Minute))
	}
	return d.String()
}

//go:embed page.html
var pageHTML string

var pageTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"dur":   formatSeconds,
	"ratio": formatRatio,
	"bytes": formatBytes,
	"opt":   formatOptInt,
	"tenant": func(t string) string {
		if t == "" {
			return "(default)"
		}
		return t
	},
	"refreshMs": func() int64 { return RefreshEvery.Milliseconds() },
}).Parse(pageHTML))

// The formatters below have twins in page.html's script, which renders
// the refreshed data the same way.

// formatSeconds shows a duration in seconds as the page does.
func formatSeconds(s float64) string {
	switch {
	case s <= 0:
		return "0s"
	case s < 10:
		return fmt.Sprintf("%.1fs", s)
	case s < 120:
		return fmt.Sprintf("%.0fs", s)
	}
	return fmt.Sprintf("%dm%02ds", int(s)/60, int(s)%60)
}

func formatRatio(r *float64) string {
	if r == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f", *r)
}

func formatOptInt(n *int) string {
	if n == nil {
		return "–"
	}
	return fmt.Sprint(*n)
}

func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	f, i := float64(n)/unit, 0
	for f >= unit && i < len(units)-1 {
		f /= unit
		i++
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", f), ".0") + " " + units[i]
}
