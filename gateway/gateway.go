// Package gateway is coordd's MCP door: it speaks MCP (Streamable HTTP)
// to agents at /mcp/NAME and forwards to backend MCP servers, unmodified,
// that it runs (stdio, a pool of processes per credential scope) or
// reaches (remote Streamable HTTP).
//
// An allowed tool call (a tool listed in coalesce, or annotated
// readOnlyHint by a server marked trust_read_only) goes through the
// engine as any fetch does: each backend server is an upstream of the
// coordinator whose base url is http://NAME.mcp.invalid/, and a call is
// the url /tools/call/TOOL?a=HASH of its arguments in canonical JSON
// (RFC 8785). The coordinator fetches it through the gateway's
// RoundTripper, which runs the call on the server and answers its result
// as a document. So one flight per key across every instance, the lease,
// L1 and L2, pushed wakeups, retries, the breaker, the rate limit and the
// slots in flight all apply to tool calls unchanged, and the engine learns
// nothing of MCP. Every other call runs on the server once per caller.
package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/upstream"
)

// upstreamPrefix names a server's upstream in the coordinator: "mcp.NAME".
const upstreamPrefix = "mcp."

// hostSuffix is the host part of a server's base url: NAME.mcp.invalid, a
// name no resolver answers (RFC 2606), so that a fetch of it can only
// ever reach the gateway's RoundTripper.
const hostSuffix = ".mcp.invalid"

// Tenant is what the gateway knows of a tenant: the servers it may use
// and its own credential for some of them.
type Tenant struct {
	Name string
	// Servers the tenant may use, by name. Nil: none.
	Servers []string
	// Env holds the tenant's own environment for stdio servers, by server
	// name: its calls run in processes of their own with it.
	Env map[string]map[string]EnvValue
	// Credentials holds the tenant's own credential for remote servers,
	// by server name, loaded.
	Credentials map[string]*upstream.Credential
	Weight      int
}

// Options are what a Gateway needs beside its servers.
type Options struct {
	// Authenticate finds the tenant a bearer token is of. Nil: no
	// tenants; every agent may use every server.
	Authenticate func(token string) (tenant string, ok bool)
	Tenants      []Tenant
	// Transport reaches remote servers. Default: a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	Logger    *slog.Logger
	Metrics   Metrics
	// AllowedOrigins are the Origins (scheme://host[:port]) a browser
	// page may call from, beside loopback ones.
	AllowedOrigins []string
	// BodyTimeout bounds reading one request's body. Default: 5s.
	BodyTimeout time.Duration
	// Redis, when set (the coordinator's), carries a coalesced
	// execution's progress to the callers waiting on other instances;
	// KeyPrefix prefixes its channels (the coordinator's key_prefix).
	// Nil: progress reaches the callers on the executing instance only.
	Redis     redis.UniversalClient
	KeyPrefix string
}

// bodyTimeout is Options.BodyTimeout or its default.
func (g *Gateway) bodyTimeout() time.Duration {
	if g.opt.BodyTimeout > 0 {
		return g.opt.BodyTimeout
	}
	return 5 * time.Second
}

// Gateway is the MCP door. Build it with New, give Upstreams to the
// coordinator's Config and the Gateway as its Options.Transport (its
// RoundTripper passes every other request to next), then Bind the
// coordinator and serve Handler.
type Gateway struct {
	servers map[string]*backend
	order   []string
	opt     Options
	log     *slog.Logger
	m       metrics
	scopes  map[string]coordinator.Scope // by tenant; "" without tenants
	next    http.RoundTripper

	httpTransport http.RoundTripper
	co            *coordinator.Coordinator

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the gateway's own goroutines (sweep)

	calls    sync.Map // callKey -> *pendingCall
	kept     keptArgs // of calls whose results are kept, for their refreshes
	sessions sessions
	progress *progressHub // nil without Options.Redis
}

// New checks servers and loads their secrets. Errors name the field
// (mcp_servers[0] (github).env.TOKEN), never a value.
func New(servers []Server, opt Options) (*Gateway, error) {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	g := &Gateway{servers: map[string]*backend{}, opt: opt, log: opt.Logger.With("component", "gateway"), m: orNop(opt.Metrics), scopes: map[string]coordinator.Scope{}}
	g.httpTransport = opt.Transport
	if g.httpTransport == nil {
		g.httpTransport = http.DefaultTransport.(*http.Transport).Clone()
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.sessions.init()
	if opt.Redis != nil {
		prefix := opt.KeyPrefix
		if prefix == "" {
			prefix = "coordd:"
		}
		g.progress = newProgressHub(opt.Redis, prefix)
	}
	var errs []error
	for i := range servers {
		s := servers[i]
		field := fmt.Sprintf("mcp_servers[%d] (%s)", i, s.Name)
		if err := s.check(field); err != nil {
			errs = append(errs, err)
			continue
		}
		if g.servers[s.Name] != nil {
			errs = append(errs, fmt.Errorf("%s.name: duplicate name %q", field, s.Name))
			continue
		}
		s.setDefaults()
		env, err := loadEnv(field+".env", s.Env)
		if err != nil {
			errs = append(errs, err)
		}
		if s.Credential != nil {
			if err := s.Credential.Load(field+".credential", g.log); err != nil {
				errs = append(errs, err)
			}
		}
		g.servers[s.Name] = &backend{g: g, cfg: &s, log: g.log.With("server", s.Name), env: env, pools: map[string]*pool{}}
		g.order = append(g.order, s.Name)
	}
	for i, t := range opt.Tenants {
		field := fmt.Sprintf("tenants[%d] (%s)", i, t.Name)
		sc := coordinator.Scope{Tenant: t.Name, Upstreams: []string{}, Credentials: map[string]*upstream.Credential{}, Weight: t.Weight}
		for _, name := range t.Servers {
			if g.servers[name] == nil {
				errs = append(errs, fmt.Errorf("%s.mcp_servers: %q is not one of mcp_servers", field, name))
				continue
			}
			sc.Upstreams = append(sc.Upstreams, upstreamPrefix+name)
		}
		for name, env := range t.Env {
			b := g.servers[name]
			if b == nil || b.cfg.URL != "" {
				errs = append(errs, fmt.Errorf("%s.credentials.%s: not a stdio server of mcp_servers", field, name))
				continue
			}
			vals, err := loadEnv(fmt.Sprintf("%s.credentials.%s", field, name), env)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			sc.Credentials[upstreamPrefix+name] = upstream.FixedCredential(envHeader, secret.New(encodeEnv(vals)))
		}
		for name, c := range t.Credentials {
			b := g.servers[name]
			if b == nil || b.cfg.URL == "" {
				errs = append(errs, fmt.Errorf("%s.credentials.%s: not a remote server of mcp_servers", field, name))
				continue
			}
			sc.Credentials[upstreamPrefix+name] = c
		}
		g.scopes[t.Name] = sc
	}
	if opt.Authenticate == nil {
		all := make([]string, 0, len(g.order))
		for _, n := range g.order {
			all = append(all, upstreamPrefix+n)
		}
		g.scopes[""] = coordinator.Scope{Upstreams: all}
	}
	if err := errors.Join(errs...); err != nil {
		g.cancel()
		return nil, err
	}
	g.wg.Go(g.sweep)
	return g, nil
}

// sweep ends the sessions idle for sessionIdle (and stops their own
// processes), once a minute, until Close.
func (g *Gateway) sweep() {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case now := <-t.C:
			g.sessions.expire(now.Add(-sessionIdle))
			g.kept.expire(now)
		}
	}
}

// SetMetrics makes m observe the gateway. Call it before serving.
func (g *Gateway) SetMetrics(m Metrics) { g.m = orNop(m) }

// Names returns the servers' names, in configuration order.
func (g *Gateway) Names() []string { return append([]string(nil), g.order...) }

// Upstreams returns the coordinator upstreams of the servers, one each,
// to add to coordinator.Config.Upstreams.
func (g *Gateway) Upstreams() []coordinator.Upstream {
	var ups []coordinator.Upstream
	for _, name := range g.order {
		s := g.servers[name].cfg
		u := coordinator.Upstream{
			Name:         upstreamPrefix + name,
			BaseURL:      "http://" + name + hostSuffix + "/",
			TTL:          s.TTL,
			StaleTTL:     s.StaleTTL,
			Timeout:      s.Timeout,
			MaxBodyBytes: s.MaxResultBytes,
			Credential:   s.Credential,
			Protection:   s.Protection,
		}
		if u.TTL == 0 {
			u.TTL = time.Second // unused: every answer says no-store (RoundTrip)
		}
		if u.Protection.RateLimit == 0 {
			u.Protection.RateLimit = -1 // an MCP server has no rate limit unless set
		}
		if s.URL == "" {
			u.Credential = nil
		}
		ups = append(ups, u)
	}
	return ups
}

// UpstreamNames are the names Upstreams gives, which no other door may
// serve.
func (g *Gateway) UpstreamNames() []string {
	var n []string
	for _, name := range g.order {
		n = append(n, upstreamPrefix+name)
	}
	return n
}

// Bind gives the gateway the coordinator built with its Upstreams and
// with Wrap's RoundTripper as Options.Transport.
func (g *Gateway) Bind(co *coordinator.Coordinator) { g.co = co }

// Wrap returns the RoundTripper to give the coordinator: the gateway's,
// passing every request that is not a tool call's to next (nil: a clone
// of http.DefaultTransport).
func (g *Gateway) Wrap(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		next = t
	}
	g.next = next
	return g
}

// Close stops every backend process and session.
func (g *Gateway) Close() error {
	g.cancel()
	g.wg.Wait()
	g.sessions.closeAll()
	for _, b := range g.servers {
		b.close()
	}
	return nil
}

// callKey names one coalesced call on this instance: the server, the
// tool, the arguments' hash and the credential scope.
type callKey struct{ server, tool, hash, cred string }

// pendingCall is a call that callers of this instance wait for: its
// arguments, for whichever fetch runs it, and its waiters (their
// progress, and their agents, whom the server may ask something).
type pendingCall struct {
	args json.RawMessage
	// once is set for a call that runs once (not coalesced): its own
	// params, its agent's session and stream, and its caller's context.
	once *onceCall
	mu   sync.Mutex
	refs int
	seq  int
	out  map[int]*replier // the waiters' answers in progress, by waiter id
	// asked is the waiter whose agent the server asked something during
	// the execution (0: none): the result is that waiter's (mine).
	asked int
	mine  *personalResult
	// abandon cancels the execution running for the call on this
	// instance (nil: none runs); abandoned says it did (abandon.go).
	abandon   context.CancelFunc
	abandoned bool
}

// personalResult is an execution's result kept for the one caller whose
// agent the server asked something.
type personalResult struct {
	res json.RawMessage
	err error
}

// statusPersonal is the document the engine gets of an execution whose
// result went to one caller alone (pendingCall.asked): the other callers
// run their own.
const statusPersonal = http.StatusConflict

// waiter is one caller's registration on a pendingCall.
type waiter struct {
	pc    *pendingCall
	id    int
	leave func()
}

// personal returns the execution's result if it was this waiter's.
func (w *waiter) personal() (personalResult, bool) {
	w.pc.mu.Lock()
	defer w.pc.mu.Unlock()
	if w.pc.asked != w.id || w.pc.mine == nil {
		return personalResult{}, false
	}
	return *w.pc.mine, true
}

func (p *pendingCall) progress(params json.RawMessage) {
	p.mu.Lock()
	outs := make([]*replier, 0, len(p.out))
	for _, o := range p.out {
		outs = append(outs, o)
	}
	p.mu.Unlock()
	for _, o := range outs {
		o.progress(params)
	}
}

// execPeer is the agent side of a shared execution: a notification of
// the server's reaches every waiter; a request goes to one waiter's
// agent (the first still waiting), whose result the execution becomes.
type execPeer struct{ pc *pendingCall }

func (e execPeer) notify(m *jsonrpc.Request) {
	e.pc.mu.Lock()
	outs := make([]*replier, 0, len(e.pc.out))
	for _, o := range e.pc.out {
		outs = append(outs, o)
	}
	e.pc.mu.Unlock()
	for _, o := range outs {
		o.notify(m)
	}
}

func (e execPeer) ask(ctx context.Context, m *jsonrpc.Request) (json.RawMessage, *jsonrpc.Error) {
	e.pc.mu.Lock()
	id := e.pc.asked
	if id == 0 {
		for wid, o := range e.pc.out {
			if o.stream && (id == 0 || wid < id) {
				id = wid
			}
		}
		e.pc.asked = id
	}
	o := e.pc.out[id]
	e.pc.mu.Unlock()
	if o == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "coordd gateway: no agent waiting on this call can be asked " + m.Method}
	}
	return o.ask(ctx, m)
}

// register makes the caller, answering through out, a waiter of k; the
// waiter's leave ends that.
func (g *Gateway) register(k callKey, args json.RawMessage, once *onceCall, out *replier) *waiter {
	for {
		v, ok := g.calls.Load(k)
		if !ok {
			v, _ = g.calls.LoadOrStore(k, &pendingCall{args: args, once: once, out: map[int]*replier{}})
		}
		p := v.(*pendingCall)
		p.mu.Lock()
		if p.refs < 0 { // being removed
			p.mu.Unlock()
			g.calls.CompareAndDelete(k, p)
			continue
		}
		p.refs++
		p.seq++
		id := p.seq
		if out != nil && once == nil { // a call run once answers on its own stream (runOnce)
			p.out[id] = out
		}
		p.mu.Unlock()
		if b := g.servers[k.server]; once == nil && b != nil && b.cfg.TTL > 0 {
			g.kept.keep(k, args, time.Now().Add(b.cfg.TTL+b.cfg.StaleTTL+time.Minute))
		}
		return &waiter{pc: p, id: id, leave: func() {
			p.mu.Lock()
			delete(p.out, id)
			p.refs--
			gone := p.refs == 0
			if gone {
				p.refs = -1
			}
			running := p.abandon != nil
			p.mu.Unlock()
			if gone {
				g.calls.CompareAndDelete(k, p)
				if running {
					g.checkAbandoned(k, p)
				}
			}
		}}
	}
}

// onceCall is a call that runs once, for one caller, through the
// server's guard.
type onceCall struct {
	params json.RawMessage // as the agent sent them, progress token aside
	se     *session
	out    *replier
	ctx    context.Context // the caller's: the call is cancelled with it
}

// argsHash names canonical arguments in a call's url.
func argsHash(canon []byte) string {
	s := sha256.Sum256(canon)
	return hex.EncodeToString(s[:])
}

// callURL is the url a coalesced call is fetched as.
func callURL(server, tool, hash string) string {
	return "http://" + server + hostSuffix + "/tools/call/" + url.PathEscape(tool) + "?a=" + hash
}

// RoundTrip runs a coalesced call on its server for the coordinator, and
// passes every other request to next. The answer is the call's result
// as a document: 200 and the result (no-store when the server keeps
// nothing or the result is an error), 422 and the JSON-RPC error the
// server answered, 502 for an internal error (retried, counted by the
// breaker), or the 429 or 5xx a remote server answered; a lost process
// or connection is a transport error, retried.
func (g *Gateway) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	host := req.URL.Hostname()
	name, ok := strings.CutSuffix(host, hostSuffix)
	b := g.servers[name]
	if !ok || b == nil {
		if ok {
			return answerOf(req, http.StatusBadRequest, "no-store", []byte(`{"code":-32602,"message":"no such server"}`)), nil
		}
		return g.next.RoundTrip(req)
	}
	tool, ok := strings.CutPrefix(req.URL.EscapedPath(), "/tools/call/")
	tool, uerr := url.PathUnescape(tool)
	cr, cerr := b.credOf(req.Header)
	if !ok || uerr != nil || cerr != nil {
		return answerOf(req, http.StatusBadRequest, "no-store", []byte(`{"code":-32602,"message":"not a tool call"}`)), nil
	}
	k := callKey{server: name, tool: tool, hash: req.URL.Query().Get("a"), cred: cr.id}
	var pc *pendingCall
	if v, ok := g.calls.Load(k); ok {
		pc = v.(*pendingCall)
	}
	if pc != nil && pc.once != nil {
		return b.runOnce(req, pc.once)
	}
	ctx := req.Context()
	var args json.RawMessage
	if pc != nil {
		args = pc.args
		var ended func() bool
		ctx, ended = g.execution(ctx, k, pc)
		defer func() {
			if ended() {
				// No caller was left: what the server answered, if
				// anything, is nobody's.
				resp, err = answerOf(req, statusAbandoned, "no-store", []byte(`{"abandoned":true}`)), nil
			}
		}()
	} else if a, ok := g.kept.get(k); ok {
		// A refresh after every caller left: it runs for the cache, with
		// nobody to tell of its progress or to ask.
		args, pc = a, &pendingCall{out: map[int]*replier{}}
	} else {
		// Nobody on this instance waits for it, and its arguments are
		// not kept: nothing to run. The callers waiting elsewhere run it
		// again.
		return answerOf(req, statusAbandoned, "no-store", []byte(`{"code":-32603,"message":"no caller of this call is waiting on this instance"}`)), nil
	}
	params, _ := json.Marshal(map[string]json.RawMessage{"name": mustJSON(tool), "arguments": args})
	progress := pc.progress // this instance's waiters, before the result
	if g.progress != nil {  // and the other instances'
		progress = func(p json.RawMessage) {
			pc.progress(p)
			g.progress.publish(ctx, k, p)
		}
	}
	res, hdr, err := b.run(ctx, cr, "tools/call", params, progress, execPeer{pc})
	g.m.execution(name, tool)
	pc.mu.Lock()
	asked := pc.asked != 0
	if asked {
		pc.mine = &personalResult{res: res, err: err}
		var re rpcError
		if errors.As(err, &re) {
			pc.mine.err = re.e
		} else if err != nil {
			pc.mine.res, pc.mine.err = toolError(fmt.Sprintf("coordd: the call to %s on MCP server %s failed: %v", tool, name, err)), nil
		}
	}
	pc.mu.Unlock()
	if asked {
		// The result answered what the server asked one agent: it is
		// that caller's alone; every other runs its own.
		return answerOf(req, statusPersonal, "no-store", []byte(`{"personal":true}`)), nil
	}
	var re rpcError
	switch {
	case err == nil:
		cc := "no-store"
		var r struct {
			IsError bool `json:"isError"`
		}
		if json.Unmarshal(res, &r) == nil && !r.IsError && b.cfg.TTL > 0 {
			cc = ""
		}
		resp := answerOf(req, http.StatusOK, cc, res)
		copyQuotaHeaders(resp.Header, hdr)
		return resp, nil
	case errors.As(err, &re):
		body, _ := json.Marshal(re.e)
		status := http.StatusUnprocessableEntity
		if re.e.Code == -32603 { // internal error: transient, as a 5xx
			status = http.StatusBadGateway
		}
		return answerOf(req, status, "no-store", body), nil
	case hdr.code() == http.StatusTooManyRequests || hdr.code() >= 500:
		resp := answerOf(req, hdr.code(), "no-store", []byte(`{"code":-32603,"message":"the server answered `+fmt.Sprint(hdr.code())+`"}`))
		copyQuotaHeaders(resp.Header, hdr)
		return resp, nil
	}
	return nil, err
}

// runOnce runs a call that is not coalesced, once: the guard admitted
// it (breaker, rate limit, slots). A failure before the call reached the
// server (no process could start) is a transport error, retried and
// counted by the breaker; once it reached the server, a lost connection
// or an internal error makes its outcome unknown, and it is answered as
// such, never run again. A remote server's 429 refused it unrun: waited
// out and retried.
func (b *backend) runOnce(req *http.Request, oc *onceCall) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	stop := context.AfterFunc(oc.ctx, cancel) // the caller left: cancel the call
	defer stop()
	c, err := b.connFor(ctx, oc.se, nil)
	if err != nil {
		return nil, err
	}
	res, hdr, err := b.runOn(ctx, c, "tools/call", oc.params, oc.out.progress, oc.out)
	var re rpcError
	switch {
	case err == nil:
		resp := answerOf(req, http.StatusOK, "no-store", res)
		copyQuotaHeaders(resp.Header, hdr)
		return resp, nil
	case hdr.code() == http.StatusTooManyRequests:
		resp := answerOf(req, hdr.code(), "no-store", []byte(`{"code":-32603,"message":"the server answered 429"}`))
		copyQuotaHeaders(resp.Header, hdr)
		return resp, nil
	case errors.As(err, &re) && re.e.Code != jsonrpc.CodeInternalError:
		body, _ := json.Marshal(re.e)
		return answerOf(req, http.StatusUnprocessableEntity, "no-store", body), nil
	case oc.ctx.Err() != nil:
		return answerOf(req, http.StatusUnprocessableEntity, "no-store", []byte(`{"code":-32603,"message":"cancelled"}`)), nil
	}
	msg := fmt.Sprintf("coordd: the call reached MCP server %s and then failed (%v); its outcome is unknown (it may or may not have run), so it is not run again", b.cfg.Name, err)
	body, _ := json.Marshal(&jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: msg})
	return answerOf(req, http.StatusUnprocessableEntity, "no-store", body), nil
}

func copyQuotaHeaders(dst http.Header, a *answer) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, vs := range a.header {
		lk := strings.ToLower(k)
		if lk == "retry-after" || strings.HasPrefix(lk, "ratelimit") || strings.HasPrefix(lk, "x-ratelimit") {
			dst[k] = vs
		}
	}
}

func answerOf(req *http.Request, status int, cacheControl string, body []byte) *http.Response {
	h := http.Header{"Content-Type": {"application/json"}}
	if cacheControl != "" {
		h.Set("Cache-Control", cacheControl)
	}
	return &http.Response{StatusCode: status, Status: http.StatusText(status), Header: h, Body: io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)), Request: req, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// run sends one request to one of cr's connections of b, with progress
// (when not nil) receiving the server's progress notifications. It
// returns what a remote server answered to the request's POST, if it is
// remote.
func (b *backend) run(ctx context.Context, cr cred, method string, params json.RawMessage, progress func(json.RawMessage), p peer) (json.RawMessage, *answer, error) {
	c, err := b.poolFor(cr).conn(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	return b.runOn(ctx, c, method, params, progress, p)
}

// runOn runs one request on c for p (nil: no agent to ask).
func (b *backend) runOn(ctx context.Context, c *conn, method string, params json.RawMessage, progress func(json.RawMessage), p peer) (json.RawMessage, *answer, error) {
	var a *answer
	if b.cfg.URL != "" {
		a = &answer{}
		ctx = context.WithValue(ctx, answerKey{}, a)
	}
	if progress != nil {
		tok := newToken()
		defer c.watch(tok, progress)()
		params = withProgressToken(params, json.RawMessage(tok))
	}
	b.executions.Add(1)
	res, err := c.call(ctx, method, params, p)
	return res, a, err
}

// withProgressToken returns params with _meta.progressToken set to tok,
// every other member as it was.
func withProgressToken(params json.RawMessage, tok json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(params, &m) != nil || m == nil {
		m = map[string]json.RawMessage{}
	}
	var meta map[string]json.RawMessage
	if raw, ok := m["_meta"]; ok {
		_ = json.Unmarshal(raw, &meta)
	}
	if meta == nil {
		meta = map[string]json.RawMessage{}
	}
	if tok == nil {
		delete(meta, "progressToken")
	} else {
		meta["progressToken"] = tok
	}
	if len(meta) == 0 {
		delete(m, "_meta")
	} else {
		m["_meta"] = mustJSON(meta)
	}
	return mustJSON(m)
}
