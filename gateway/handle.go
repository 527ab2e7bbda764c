package gateway

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/coordd/coordd/coordinator"
)

// scopeCred is the credential a session of scope sc uses towards b: the
// tenant's own, else the server's (remote), else none.
func (b *backend) scopeCred(sc coordinator.Scope) (cred, error) {
	c := sc.Credentials[upstreamPrefix+b.cfg.Name]
	if c == nil {
		c = b.cfg.Credential
	}
	if c == nil {
		return cred{}, nil
	}
	h := http.Header{}
	h.Set(c.Header, c.Value().Reveal())
	return b.credOf(h)
}

// shared reports whether b's connections are shared by sessions (a pool,
// or a remote server), so that its calls may be coalesced.
func (b *backend) shared() bool { return b.cfg.URL != "" || b.cfg.Processes > 0 }

// connFor returns the connection se's calls use: its own process when
// the server has one per session, else one of its scope's pool.
func (b *backend) connFor(ctx context.Context, se *session, skip *conn) (*conn, error) {
	if b.shared() {
		return b.poolFor(se.cred).conn(ctx, skip)
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.own != nil && se.own.alive() {
		return se.own, nil
	}
	if se.own != nil {
		b.g.m.restart(b.cfg.Name)
	}
	c, err := b.dial(ctx, se.cred, se.caps)
	if err != nil {
		return nil, err
	}
	se.own = c
	return c, nil
}

// handle answers one request of se's agent.
func (g *Gateway) handle(ctx context.Context, se *session, b *backend, req *jsonrpc.Request, out *replier) (json.RawMessage, error) {
	switch req.Method {
	case "ping":
		return json.RawMessage(`{}`), nil
	case "tools/call":
		return g.toolCall(ctx, se, b, req.Params, out)
	case "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read", "prompts/get":
		return b.list(ctx, se, req.Method, req.Params)
	}
	// completion/complete, logging/setLevel, subscriptions and methods
	// coordd does not know: forwarded as they are.
	return b.forward(ctx, se, req.Method, req.Params, out, true)
}

// forward runs one request on se's connection. A read (retry) that lost
// its connection runs once more on another; a write that did gets an
// error that says its outcome is unknown.
func (b *backend) forward(ctx context.Context, se *session, method string, params json.RawMessage, out *replier, retry bool) (json.RawMessage, error) {
	var progress func(json.RawMessage)
	var p peer
	if out != nil {
		progress, p = out.progress, out
	}
	var skip *conn
	for attempt := 0; ; attempt++ {
		c, err := b.connFor(ctx, se, skip)
		if err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("coordd: MCP server %s is unavailable: %v", b.cfg.Name, err)}
		}
		cctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
		res, _, err := b.runOn(cctx, c, method, params, progress, p)
		cancel()
		var re rpcError
		switch {
		case err == nil:
			return res, nil
		case errors.As(err, &re):
			return nil, re.e
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, errConnLost) && retry && attempt == 0:
			skip = c
			b.g.m.retry(b.cfg.Name)
			continue
		case errors.Is(err, errConnLost):
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("coordd: the connection to MCP server %s was lost during the call; its outcome is unknown (it may or may not have run)", b.cfg.Name)}
		}
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("coordd: MCP server %s: %v", b.cfg.Name, err)}
	}
}

// listKey names a cached list: a method and its params, for one
// credential scope.
type listKey struct{ cred, method, params string }

type listEntry struct {
	once sync.Once
	at   time.Time
	res  json.RawMessage
	err  error

	roOnce sync.Once
	ro     map[string]bool // of a tools/list: the tools annotated readOnlyHint
}

// list answers tools/list, the other lists, resources/read and
// prompts/get, cached per credential scope for listCacheFresh and
// dropped on list_changed (a read on resources/updated): one request to
// the server per list per scope while many agents start at once.
func (b *backend) list(ctx context.Context, se *session, method string, params json.RawMessage) (json.RawMessage, error) {
	if !b.shared() {
		return b.forward(ctx, se, method, params, nil, true)
	}
	e, err := b.listEntry(ctx, se, method, params)
	if err != nil {
		return nil, err
	}
	return e.res, nil
}

func (b *backend) listEntry(ctx context.Context, se *session, method string, params json.RawMessage) (*listEntry, error) {
	k := listKey{cred: se.cred.id, method: method, params: string(params)}
	for {
		v, ok := b.lists.Load(k)
		if !ok {
			v, _ = b.lists.LoadOrStore(k, &listEntry{})
		}
		e := v.(*listEntry)
		e.once.Do(func() {
			e.res, e.err = b.forward(context.WithoutCancel(ctx), se, method, params, nil, true)
			e.at = time.Now()
		})
		if e.err != nil || time.Since(e.at) > listCacheFresh {
			b.lists.CompareAndDelete(k, e)
			if e.err != nil {
				return nil, e.err
			}
			continue
		}
		return e, nil
	}
}

// readOnly reports whether the server annotates tool readOnlyHint, from
// the first page of its tools/list for se's scope (a tool on a later
// page is not coalesced), parsed once per cached list.
func (b *backend) readOnly(ctx context.Context, se *session, tool string) bool {
	if !b.shared() {
		return false
	}
	e, err := b.listEntry(ctx, se, "tools/list", nil)
	if err != nil {
		return false
	}
	e.roOnce.Do(func() {
		var l struct {
			Tools []struct {
				Name        string `json:"name"`
				Annotations struct {
					ReadOnly bool `json:"readOnlyHint"`
				} `json:"annotations"`
			} `json:"tools"`
		}
		e.ro = map[string]bool{}
		if json.Unmarshal(e.res, &l) == nil {
			for _, t := range l.Tools {
				if t.Annotations.ReadOnly {
					e.ro[t.Name] = true
				}
			}
		}
	})
	return e.ro[tool]
}

// onceMark starts the key of a call that runs once (callURL's hash):
// never the hex of a SHA-256.
const onceMark = "once-"

// otherTool is the tool label of calls not coalesced (see Metrics).
const otherTool = "other"

func invalidParams(format string, args ...any) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(format, args...)}
}

// toolError is a tools/call result that tells the agent the call failed
// (isError), as MCP has a tool say so.
func toolError(msg string) json.RawMessage {
	return mustJSON(map[string]any{"content": []any{map[string]any{"type": "text", "text": msg}}, "isError": true})
}

// toolCall runs or coalesces one tools/call.
func (g *Gateway) toolCall(ctx context.Context, se *session, b *backend, params json.RawMessage, out *replier) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(params, &m); err != nil || m == nil {
		return nil, invalidParams("tools/call: params must be an object with name and arguments")
	}
	var name string
	if err := json.Unmarshal(m["name"], &name); err != nil || name == "" {
		return nil, invalidParams("tools/call: name must be a non-empty string")
	}
	if len(name) > 256 {
		return nil, invalidParams("tools/call: name is over 256 bytes")
	}
	args := m["arguments"]
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	canon, err := canonicalJSON(args)
	if err != nil {
		return nil, invalidParams("tools/call: arguments: %v", err)
	}
	if len(canon) > MaxArgumentBytes {
		return nil, invalidParams("tools/call: arguments are %d bytes; the bound is %d", len(canon), MaxArgumentBytes)
	}
	plain := true // nothing but name, arguments and _meta: no task, no input responses
	for k := range m {
		if k != "name" && k != "arguments" && k != "_meta" {
			plain = false
		}
	}
	coalesced := plain && b.shared() && b.cfg.coalesces(name, b.cfg.TrustReadOnly && b.readOnly(ctx, se, name))
	if coalesced {
		g.m.call(b.cfg.Name, name)
	} else {
		g.m.call(b.cfg.Name, otherTool)
	}
	res, personal, err := g.fetchCall(ctx, se, b, name, params, canon, out, coalesced)
	if personal {
		// The server asked another caller's agent something during the
		// shared execution: its result was that caller's. This one runs
		// its own.
		res, _, err = g.fetchCall(ctx, se, b, name, params, canon, out, false)
	}
	return res, err
}

// fetchCall runs one tools/call through the engine: coalesced (keyed by
// its canonical arguments), or once (a key of its own: it runs once,
// through the guard, never again once it reached the server: it may
// write). personal reports a shared execution during which the server
// asked another caller's agent something: its result is not this
// caller's.
func (g *Gateway) fetchCall(ctx context.Context, se *session, b *backend, name string, params, canon json.RawMessage, out *replier, coalesced bool) (_ json.RawMessage, personal bool, _ error) {
	var once *onceCall
	hash := ""
	if coalesced {
		hash = argsHash(canon)
	} else {
		once = &onceCall{params: withProgressToken(params, nil), se: se, out: out, ctx: ctx}
		hash = onceMark + rand.Text()
	}
	t, err := g.co.ResolveRequest(se.scope, coordinator.Request{URL: callURL(b.cfg.Name, name, hash)})
	if err != nil {
		return nil, false, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: err.Error()}
	}
	k := callKey{server: b.cfg.Name, tool: name, hash: hash, cred: se.cred.id}
	w := g.register(k, canon, once, out)
	defer w.leave()
	if coalesced && g.progress != nil && out.token != nil {
		defer g.progress.watch(ctx, g, k, out)()
	}
	var opt coordinator.GetOptions
	if coalesced && g.progress != nil {
		// While this instance's flight follows another instance's, the
		// executing instance learns that a caller waits here.
		var left func()
		defer func() {
			if left != nil {
				left()
			}
		}()
		opt.Progress = func(p coordinator.Progress) {
			if p.Stage == coordinator.StageWaitingLeader && left == nil {
				left = g.progress.waitingElsewhere(ctx, k, b.cfg.Timeout+time.Minute)
			}
		}
	}
	res, err := g.co.Get(ctx, t, opt)
	for try := 0; err == nil && res.Doc.StatusCode == statusAbandoned && try < abandonRetries; try++ {
		// The execution this call joined was cancelled as its callers
		// left (or was not run for want of them): run it again.
		res, err = g.co.Get(ctx, t, opt)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return toolError(fmt.Sprintf("coordd: the call to %s on MCP server %s failed: %v", name, b.cfg.Name, err)), false, nil
	}
	if coalesced {
		g.m.served(b.cfg.Name, name, res.Source.String())
	}
	switch d := res.Doc; d.StatusCode {
	case http.StatusOK:
		return d.Body, false, nil
	case http.StatusUnprocessableEntity:
		var e jsonrpc.Error
		if json.Unmarshal(d.Body, &e) == nil && e.Code != 0 {
			return nil, false, &e
		}
	case statusPersonal:
		if r, ok := w.personal(); ok {
			return r.res, false, r.err
		}
		return nil, true, nil
	}
	return toolError(fmt.Sprintf("coordd: the call to %s on MCP server %s failed (%d)", name, b.cfg.Name, res.Doc.StatusCode)), false, nil
}
