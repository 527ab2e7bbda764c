package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/coordd/coordd/coordinator"
)

// The agents' side is coordd's own Streamable HTTP server, not the SDK's
// StreamableHTTPHandler: that one serves an mcp.Server, which answers
// methods it knows itself and refuses the others, and its transport ties
// a notification to its request's stream only through a context key of
// its own; a relay must forward every method and send each caller's
// progress on that caller's stream. It serves POST (one message; a
// request is answered as JSON, or as an SSE stream when the agent accepts
// one and asked for progress) and DELETE; GET has no stream to offer
// (405, as the transport allows).

const (
	sessionHeader  = "Mcp-Session-Id"
	versionHeader  = "Mcp-Protocol-Version"
	maxSessions    = 10000
	sessionIdle    = 30 * time.Minute
	listCacheFresh = 5 * time.Second
)

// Handler serves /mcp/NAME for every server.
func (g *Gateway) Handler() http.Handler { return http.HandlerFunc(g.serve) }

type session struct {
	id     string
	server string
	tenant string
	scope  coordinator.Scope
	cred   cred
	caps   json.RawMessage // the agent's capabilities, declared to its own process
	last   time.Time       // guarded by sessions.mu

	mu    sync.Mutex
	calls map[string]context.CancelFunc     // by the agent's request id (JSON)
	asks  map[string]chan *jsonrpc.Response // backends' requests sent to the agent, by coordd's id
	seq   int
	own   *conn // the session's own process (processes: 0)
}

// expect registers a request sent to the agent under a new id.
func (se *session) expect() (string, chan *jsonrpc.Response) {
	se.mu.Lock()
	defer se.mu.Unlock()
	se.seq++
	id := fmt.Sprintf("coordd-%d", se.seq)
	ch := make(chan *jsonrpc.Response, 1)
	if se.asks == nil {
		se.asks = map[string]chan *jsonrpc.Response{}
	}
	se.asks[id] = ch
	return id, ch
}

func (se *session) forget(id string) {
	se.mu.Lock()
	delete(se.asks, id)
	se.mu.Unlock()
}

// answered routes the agent's answer to the request it answers; an
// answer to nothing asked is dropped.
func (se *session) answered(resp *jsonrpc.Response) {
	id, _ := resp.ID.Raw().(string)
	se.mu.Lock()
	ch := se.asks[id]
	delete(se.asks, id)
	se.mu.Unlock()
	if ch != nil {
		ch <- resp
	}
}

type sessions struct {
	mu sync.Mutex
	m  map[string]*session
}

func (s *sessions) init() { s.m = map[string]*session{} }

func (s *sessions) add(se *session) error {
	now := time.Now()
	s.mu.Lock()
	full := len(s.m) >= maxSessions
	s.mu.Unlock()
	if full {
		s.expire(now.Add(-sessionIdle)) // outside the lock: ending one may wait for its process
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= maxSessions {
		return errors.New("too many sessions; end some (DELETE) or try later")
	}
	se.last = now
	s.m[se.id] = se
	return nil
}

func (s *sessions) get(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.m[id]
	if se != nil {
		se.last = time.Now()
	}
	return se
}

func (s *sessions) remove(id string) {
	s.mu.Lock()
	se := s.m[id]
	delete(s.m, id)
	s.mu.Unlock()
	if se != nil {
		se.end()
	}
}

// expire ends the sessions last used before cutoff.
func (s *sessions) expire(cutoff time.Time) {
	var gone []*session
	s.mu.Lock()
	for id, se := range s.m {
		if se.last.Before(cutoff) {
			delete(s.m, id)
			gone = append(gone, se)
		}
	}
	s.mu.Unlock()
	for _, se := range gone {
		se.end()
	}
}

func (s *sessions) closeAll() {
	s.mu.Lock()
	all := s.m
	s.m = map[string]*session{}
	s.mu.Unlock()
	for _, se := range all {
		se.end()
	}
}

func (se *session) end() {
	se.mu.Lock()
	defer se.mu.Unlock()
	for _, cancel := range se.calls {
		cancel()
	}
	if se.own != nil {
		se.own.close()
		se.own = nil
	}
}

// httpError answers a request that never reached a method with a
// JSON-RPC error and status.
func httpError(w http.ResponseWriter, status int, code int64, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": msg}})
	_, _ = w.Write(b)
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	name, _ := strings.CutPrefix(r.URL.Path, "/mcp/")
	b := g.servers[name]
	if b == nil {
		httpError(w, http.StatusNotFound, jsonrpc.CodeInvalidRequest, fmt.Sprintf("no MCP server named %.64q; the servers are at /mcp/NAME, one of %s", name, strings.Join(g.order, ", ")))
		return
	}
	if len(r.TransferEncoding) > 0 {
		// MCP bodies are bounded JSON that needs no chunking; with a
		// Content-Length too it is how a request is smuggled past a front
		// proxy (as the MCP servers refuse it, security.md).
		w.Header().Set("Connection", "close")
		httpError(w, http.StatusBadRequest, jsonrpc.CodeInvalidRequest, "Transfer-Encoding is not accepted: send Content-Length")
		return
	}
	if !hostOK(r) {
		httpError(w, http.StatusForbidden, jsonrpc.CodeInvalidRequest, fmt.Sprintf("Host %.100q is not a loopback name, and this listener is on loopback (DNS rebinding)", r.Host))
		return
	}
	if !g.originOK(r) {
		httpError(w, http.StatusForbidden, jsonrpc.CodeInvalidRequest, "Origin not allowed")
		return
	}
	tenant := ""
	if g.opt.Authenticate != nil {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if ok {
			tenant, ok = g.opt.Authenticate(strings.TrimSpace(tok))
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", "Bearer")
			httpError(w, http.StatusUnauthorized, jsonrpc.CodeInvalidRequest, "a bearer token is required: send it as Authorization: Bearer TOKEN")
			return
		}
	}
	sc, ok := g.scopes[tenant]
	if !ok || !slices.Contains(sc.Upstreams, upstreamPrefix+name) {
		httpError(w, http.StatusForbidden, jsonrpc.CodeInvalidRequest, fmt.Sprintf("tenant %q may not use MCP server %q", tenant, name))
		return
	}
	if v := r.Header.Get(versionHeader); v != "" && !knownVersion(v) {
		httpError(w, http.StatusBadRequest, jsonrpc.CodeInvalidRequest, fmt.Sprintf("protocol version %.40q is not one of %s", v, strings.Join(protocolVersions, ", ")))
		return
	}
	switch r.Method {
	case http.MethodPost:
		g.post(w, r, b, tenant, sc)
	case http.MethodDelete:
		se := g.sessions.get(r.Header.Get(sessionHeader))
		if se == nil || se.tenant != tenant || se.server != name {
			httpError(w, http.StatusNotFound, jsonrpc.CodeInvalidRequest, "no such session")
			return
		}
		g.sessions.remove(se.id)
		w.WriteHeader(http.StatusOK)
	default:
		w.Header().Set("Allow", "POST, DELETE")
		httpError(w, http.StatusMethodNotAllowed, jsonrpc.CodeInvalidRequest, "this endpoint takes POST (and DELETE to end a session)")
	}
}

// hostOK refuses, on a loopback listener, a Host that is not a loopback
// name: a page of another site whose name was rebound to 127.0.0.1 (as
// the SDK's own handler does).
func hostOK(r *http.Request) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || la == nil || !loopback(la.String()) {
		return true
	}
	return loopback(r.Host)
}

// loopback reports whether addr (host or host:port) names this machine.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// originOK refuses a browser page of another origin (DNS rebinding): an
// Origin, when sent, must be one of AllowedOrigins, or the request's own
// origin on a loopback name.
func (g *Gateway) originOK(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	if slices.Contains(g.opt.AllowedOrigins, o) {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false
	}
	// The page's own origin on a loopback name only: a rebinding page
	// sends its own name as both Host and Origin, so an Origin that merely
	// matches Host proves nothing (as the MCP servers decide, security.md).
	return u.Host == r.Host && loopback(u.Host)
}

func (g *Gateway) post(w http.ResponseWriter, r *http.Request, b *backend, tenant string, sc coordinator.Scope) {
	if r.ContentLength > maxBodyBytes { // announced: refused before reading anything
		w.Header().Set("Connection", "close")
		httpError(w, http.StatusRequestEntityTooLarge, jsonrpc.CodeInvalidRequest, fmt.Sprintf("the message is over %d bytes", maxBodyBytes))
		return
	}
	// A body that trickles in is bounded in time, as the HTTP door's is:
	// a stalled sender cannot hold a connection and a goroutine.
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(g.bodyTimeout())) == nil
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.Header().Set("Connection", "close")
			httpError(w, http.StatusRequestTimeout, jsonrpc.CodeInvalidRequest, fmt.Sprintf("the message did not arrive within %v", g.bodyTimeout()))
			return
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			w.Header().Set("Connection", "close")
			httpError(w, http.StatusRequestEntityTooLarge, jsonrpc.CodeInvalidRequest, fmt.Sprintf("the message is over %d bytes", maxBodyBytes))
			return
		}
		httpError(w, http.StatusBadRequest, jsonrpc.CodeParseError, "reading the message failed")
		return
	}
	if !utf8.Valid(body) {
		httpError(w, http.StatusBadRequest, jsonrpc.CodeParseError, "the message is not valid UTF-8")
		return
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		httpError(w, http.StatusBadRequest, jsonrpc.CodeInvalidRequest, "batches are not accepted: send one message a request")
		return
	}
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		httpError(w, http.StatusBadRequest, jsonrpc.CodeParseError, "not a JSON-RPC 2.0 message")
		return
	}
	req, _ := msg.(*jsonrpc.Request)
	if req != nil && req.Method == "initialize" {
		g.initialize(w, r, b, tenant, sc, req)
		return
	}
	id := r.Header.Get(sessionHeader)
	if id == "" && req != nil && req.IsCall() && req.Method == "server/discover" {
		// The stateless discovery of protocol 2026-07-28 (SEP-2575): coordd
		// speaks the versions with sessions, and a client falls back to
		// initialize on this error.
		writeJSON(w, &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "server/discover is not offered: initialize (protocol " + protocolVersions[0] + " or older)"}}, "")
		return
	}
	if id == "" {
		httpError(w, http.StatusBadRequest, jsonrpc.CodeInvalidRequest, "Mcp-Session-Id is required; initialize first")
		return
	}
	se := g.sessions.get(id)
	if se == nil || se.tenant != tenant || se.server != b.cfg.Name {
		httpError(w, http.StatusNotFound, jsonrpc.CodeInvalidRequest, "no such session; initialize again")
		return
	}
	if req == nil { // the agent's answer to a request of a backend's
		if resp, ok := msg.(*jsonrpc.Response); ok {
			se.answered(resp)
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if !req.IsCall() {
		if req.Method == "notifications/cancelled" {
			var p struct {
				RequestID json.RawMessage `json:"requestId"`
			}
			if json.Unmarshal(req.Params, &p) == nil {
				se.mu.Lock()
				cancel := se.calls[string(p.RequestID)]
				se.mu.Unlock()
				if cancel != nil {
					cancel()
				}
			}
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	idKey := string(mustJSON(req.ID.Raw()))
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	se.mu.Lock()
	if se.calls == nil {
		se.calls = map[string]context.CancelFunc{}
	}
	se.calls[idKey] = cancel
	se.mu.Unlock()
	defer func() {
		se.mu.Lock()
		delete(se.calls, idKey)
		se.mu.Unlock()
	}()
	out := newReplier(w, r, req, se)
	res, rerr := g.handle(ctx, se, b, req, out)
	if ctx.Err() != nil && r.Context().Err() == nil {
		// Cancelled by the agent: no answer is owed (the spec says the
		// receiver should not answer a cancelled request).
		out.finish(nil)
		return
	}
	out.finish(&jsonrpc.Response{ID: req.ID, Result: res, Error: rerr})
}

// initialize opens a session: coordd answers the agent in a version both
// speak, with the backend's capabilities, server info and instructions.
func (g *Gateway) initialize(w http.ResponseWriter, r *http.Request, b *backend, tenant string, sc coordinator.Scope, req *jsonrpc.Request) {
	var p struct {
		ProtocolVersion string          `json:"protocolVersion"`
		Capabilities    json.RawMessage `json:"capabilities"`
	}
	_ = json.Unmarshal(req.Params, &p)
	caps := p.Capabilities
	if len(caps) == 0 || caps[0] != '{' {
		caps = json.RawMessage(`{}`)
	}
	version := protocolVersions[0]
	if knownVersion(p.ProtocolVersion) {
		version = p.ProtocolVersion
	}
	cr, err := b.scopeCred(sc)
	if err != nil {
		writeJSON(w, &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}}, "")
		return
	}
	se := &session{id: rand.Text(), server: b.cfg.Name, tenant: tenant, scope: sc, cred: cr, caps: caps}
	ctx, cancel := context.WithTimeout(r.Context(), b.cfg.InitTimeout)
	defer cancel()
	// The backend's own answer when it starts; while it cannot, the last
	// one it gave, else tools alone: the agent connects, and its calls get
	// tool errors that say why (and the breaker's fast refusals), which
	// tell it more than a failed initialize.
	init := json.RawMessage(`{"capabilities":{"tools":{}},"serverInfo":{"name":` + string(mustJSON(b.cfg.Name)) + `,"version":"unknown"}}`)
	if c, err := b.connFor(ctx, se, nil); err == nil {
		init = c.init
		b.lastInit.Store(&c.init)
	} else if last := b.lastInit.Load(); last != nil {
		init = *last
		b.log.Warn("mcp server unavailable at an agent's initialize; answered with its last capabilities", "server", b.cfg.Name, "err", err)
	} else {
		b.log.Warn("mcp server unavailable at an agent's initialize; answered with tools alone", "server", b.cfg.Name, "err", err)
	}
	var ir map[string]json.RawMessage
	_ = json.Unmarshal(init, &ir)
	out := map[string]json.RawMessage{"protocolVersion": mustJSON(version)}
	for _, k := range []string{"capabilities", "serverInfo", "instructions", "_meta"} {
		if v, ok := ir[k]; ok {
			out[k] = v
		}
	}
	if _, ok := out["capabilities"]; !ok {
		out["capabilities"] = json.RawMessage(`{}`)
	}
	if err := g.sessions.add(se); err != nil {
		se.end()
		writeJSON(w, &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}}, "")
		return
	}
	writeJSON(w, &jsonrpc.Response{ID: req.ID, Result: mustJSON(out)}, se.id)
}

func writeJSON(w http.ResponseWriter, resp *jsonrpc.Response, sessionID string) {
	data, err := jsonrpc.EncodeMessage(resp)
	if err != nil {
		httpError(w, http.StatusInternalServerError, jsonrpc.CodeInternalError, "encoding the answer failed")
		return
	}
	if sessionID != "" {
		w.Header().Set(sessionHeader, sessionID)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}

// replier answers one request: as JSON, or as an SSE stream (when the
// agent accepts one) that first carries what the backend sends the agent
// during the call: its progress under the agent's own token, its log
// messages, and its requests (sampling, elicitation), whose answers come
// back in the agent's later POSTs.
type replier struct {
	w      http.ResponseWriter
	se     *session
	token  json.RawMessage // the caller's progress token; nil: none
	stream bool            // the agent accepts text/event-stream
	mu     sync.Mutex
	sse    bool // the stream has started
	done   bool
	ended  chan struct{} // closed by finish: nothing more can reach the agent
}

func newReplier(w http.ResponseWriter, r *http.Request, req *jsonrpc.Request, se *session) *replier {
	var p struct {
		Meta struct {
			Token json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
	}
	_ = json.Unmarshal(req.Params, &p)
	out := &replier{w: w, se: se, stream: strings.Contains(r.Header.Get("Accept"), "text/event-stream"), ended: make(chan struct{})}
	if len(p.Meta.Token) > 0 && string(p.Meta.Token) != "null" {
		out.token = p.Meta.Token
	}
	return out
}

// progress sends a progress notification of the backend's (params with
// the backend's token) to the caller under its own token.
func (o *replier) progress(params json.RawMessage) {
	if o.token == nil {
		return
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(params, &m) != nil {
		return
	}
	m["progressToken"] = o.token
	o.send(&jsonrpc.Request{Method: "notifications/progress", Params: mustJSON(m)})
}

// notify passes a notification of the backend's to the agent.
func (o *replier) notify(m *jsonrpc.Request) {
	o.send(&jsonrpc.Request{Method: m.Method, Params: m.Params})
}

// ask sends a request of the backend's to the agent under an id of
// coordd's and waits for its answer.
func (o *replier) ask(ctx context.Context, m *jsonrpc.Request) (json.RawMessage, *jsonrpc.Error) {
	if !o.stream {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "coordd gateway: the agent's call takes no event stream, so " + m.Method + " cannot reach it"}
	}
	id, ch := o.se.expect()
	defer o.se.forget(id)
	rid, _ := jsonrpc.MakeID(id)
	if !o.send(&jsonrpc.Request{ID: rid, Method: m.Method, Params: m.Params}) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "coordd gateway: the agent's call has ended"}
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			var we *jsonrpc.Error
			if errors.As(r.Error, &we) {
				return nil, we
			}
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: r.Error.Error()}
		}
		return r.Result, nil
	case <-ctx.Done():
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "coordd gateway: the agent did not answer " + m.Method}
	case <-o.ended:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "coordd gateway: the agent's call ended before it answered " + m.Method}
	}
}

// send writes msg on the call's stream; false when it cannot.
func (o *replier) send(msg *jsonrpc.Request) bool {
	if !o.stream {
		return false
	}
	data, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return false
	}
	o.startSSE()
	o.event(data)
	return true
}

func (o *replier) startSSE() {
	if o.sse {
		return
	}
	o.sse = true
	o.w.Header().Set("Content-Type", "text/event-stream")
	o.w.Header().Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
}

func (o *replier) event(data []byte) {
	_, _ = fmt.Fprintf(o.w, "event: message\ndata: %s\n\n", data)
	if f, ok := o.w.(http.Flusher); ok {
		f.Flush()
	}
}

// finish sends resp (nil: nothing, the request was cancelled) and ends
// the answer.
func (o *replier) finish(resp *jsonrpc.Response) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.done {
		close(o.ended)
	}
	o.done = true
	if resp == nil {
		if !o.sse {
			o.w.WriteHeader(http.StatusAccepted)
		}
		return
	}
	if resp.Error == nil && resp.Result == nil {
		resp.Result = json.RawMessage(`{}`)
	}
	data, err := jsonrpc.EncodeMessage(resp)
	if err != nil {
		data, _ = jsonrpc.EncodeMessage(&jsonrpc.Response{ID: resp.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "encoding the answer failed"}})
	}
	if o.sse {
		o.event(data)
		return
	}
	o.w.Header().Set("Content-Type", "application/json")
	_, _ = o.w.Write(data)
}
