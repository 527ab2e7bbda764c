package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Protocol versions coordd speaks, newest first. It negotiates one with
// each side on its own: an agent on the newest can use a backend that
// speaks only the oldest.
var protocolVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

func knownVersion(v string) bool {
	for _, k := range protocolVersions {
		if k == v {
			return true
		}
	}
	return false
}

// errConnLost says that a backend connection ended (the process exited,
// the remote server went away) before a call was answered: a read-only
// call may run again elsewhere, a write's outcome is unknown.
var errConnLost = errors.New("backend connection lost")

// rpcError is a JSON-RPC error a backend answered.
type rpcError struct{ e *jsonrpc.Error }

func (e rpcError) Error() string {
	return fmt.Sprintf("backend answered error %d: %s", e.e.Code, e.e.Message)
}

// conn is one JSON-RPC connection to a backend MCP server, initialized,
// with its own request ids: every call a caller makes is sent under an id
// of the conn's, and its answer routed back by that id, so that callers'
// ids never meet the backend and a backend that answers an id it was not
// asked cannot reach anyone.
type conn struct {
	c    mcp.Connection
	log  *slog.Logger
	init json.RawMessage // the backend's initialize result
	// version is the protocol version agreed with the backend.
	version string

	next atomic.Int64
	mu   sync.Mutex
	pend map[int64]*pending
	prog map[string]func(json.RawMessage) // by the progress token coordd sent
	err  error                            // set once the read loop ends
	done chan struct{}

	// onNotify, when set, receives the backend's other notifications
	// (list_changed). Called from the read loop.
	onNotify func(method string)
}

// poolCapabilities are what coordd declares to a server whose processes
// agents share: it can pass a sampling or elicitation request to the
// agent whose call is in progress (and refuses it when there is none).
var poolCapabilities = json.RawMessage(`{"sampling":{},"elicitation":{}}`)

// dial connects t and initializes the backend within timeout, declaring
// caps (the client capabilities).
func dial(ctx context.Context, t mcp.Transport, timeout time.Duration, log *slog.Logger, caps json.RawMessage, onNotify func(string)) (*conn, error) {
	ictx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c0, err := t.Connect(ictx)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	c := &conn{c: c0, log: log, pend: map[int64]*pending{}, prog: map[string]func(json.RawMessage){}, done: make(chan struct{}), onNotify: onNotify}
	go c.readLoop()
	params, _ := json.Marshal(map[string]any{
		"protocolVersion": protocolVersions[0],
		"capabilities":    caps,
		"clientInfo":      map[string]any{"name": "coordd-gateway", "version": "1"},
	})
	res, err := c.call(ictx, "initialize", params, nil)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("initialize: %w", err)
	}
	var ir struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := json.Unmarshal(res, &ir); err != nil || !knownVersion(ir.ProtocolVersion) {
		c.close()
		return nil, fmt.Errorf("initialize: the backend answered protocol version %.40q, which coordd does not speak", ir.ProtocolVersion)
	}
	c.init, c.version = res, ir.ProtocolVersion
	if err := c.c.Write(ictx, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)}); err != nil {
		c.close()
		return nil, fmt.Errorf("initialized: %w", err)
	}
	return c, nil
}

func (c *conn) readLoop() {
	var err error
	for {
		var msg jsonrpc.Message
		msg, err = c.c.Read(context.Background())
		if err != nil {
			break
		}
		switch m := msg.(type) {
		case *jsonrpc.Response:
			id, ok := m.ID.Raw().(int64)
			c.mu.Lock()
			p := c.pend[id]
			delete(c.pend, id)
			c.mu.Unlock()
			if !ok || p == nil {
				c.log.Warn("mcp backend answered an id it was not asked; dropped")
				continue
			}
			p.ch <- m
		case *jsonrpc.Request:
			c.request(m)
		}
	}
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", errConnLost, err)
	pend := c.pend
	c.pend = nil
	c.mu.Unlock()
	for _, p := range pend {
		close(p.ch)
	}
	close(c.done)
}

// pending is a call sent to the backend and not yet answered.
type pending struct {
	ch   chan *jsonrpc.Response
	peer peer // nil: no agent to ask
}

// peer is the agent a call runs for: what the backend sends during the
// call that is not progress (a log message, a sampling or elicitation
// request) reaches it.
type peer interface {
	notify(m *jsonrpc.Request)
	ask(ctx context.Context, m *jsonrpc.Request) (json.RawMessage, *jsonrpc.Error)
}

// peerOf is the agent of the one call in progress: over stdio a
// backend's message does not say which call it belongs to, so it can be
// routed only when one call is.
func (c *conn) peerOf() peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pend) != 1 {
		return nil
	}
	for _, p := range c.pend {
		return p.peer
	}
	return nil
}

// request handles a message the backend sends unasked.
func (c *conn) request(m *jsonrpc.Request) {
	if !m.IsCall() {
		switch m.Method {
		case "notifications/progress":
			var p struct {
				Token json.RawMessage `json:"progressToken"`
			}
			if json.Unmarshal(m.Params, &p) == nil {
				c.mu.Lock()
				fn := c.prog[string(p.Token)]
				c.mu.Unlock()
				if fn != nil {
					fn(m.Params)
				}
			}
		case "notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/resources/list_changed":
			if c.onNotify != nil {
				c.onNotify(m.Method)
			}
		case "notifications/resources/updated":
			if c.onNotify != nil {
				c.onNotify(m.Method) // a cached read is out of date
			}
			if p := c.peerOf(); p != nil {
				p.notify(m)
			}
		default:
			if p := c.peerOf(); p != nil {
				p.notify(m)
			}
		}
		return
	}
	// A request of the backend's: a ping is answered; sampling,
	// elicitation and roots go to the agent whose call is in progress,
	// and are refused when there is none to ask (as by a client that never
	// declared the capability).
	resp := &jsonrpc.Response{ID: m.ID}
	if m.Method == "ping" {
		resp.Result = json.RawMessage(`{}`)
		_ = c.c.Write(context.Background(), resp)
		return
	}
	p := c.peerOf()
	if p == nil {
		resp.Error = &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "coordd gateway: no single agent to ask " + m.Method}
		_ = c.c.Write(context.Background(), resp)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		go func() {
			select {
			case <-c.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		res, err := p.ask(ctx, m)
		if err != nil {
			resp.Error = err
		} else {
			resp.Result = res
		}
		_ = c.c.Write(context.Background(), resp)
	}()
}

// call sends method with params and waits for the answer. When ctx ends
// first, the backend is told that the request is cancelled.
func (c *conn) call(ctx context.Context, method string, params json.RawMessage, p peer) (json.RawMessage, error) {
	n := c.next.Add(1)
	id, _ := jsonrpc.MakeID(float64(n))
	ch := make(chan *jsonrpc.Response, 1)
	c.mu.Lock()
	if c.pend == nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pend[n] = &pending{ch: ch, peer: p}
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		if c.pend != nil {
			delete(c.pend, n)
		}
		c.mu.Unlock()
	}
	// A remote transport's Write may wait for the server's answer (the
	// go-sdk's posts the request and reads its answer's first event), and
	// not end with ctx: the call waits on Write, its answer and ctx at once.
	wrote := make(chan error, 1)
	go func() { wrote <- c.c.Write(ctx, &jsonrpc.Request{ID: id, Method: method, Params: params}) }()
	for {
		select {
		case err := <-wrote:
			if err != nil && ctx.Err() == nil {
				forget()
				return nil, fmt.Errorf("%w: %v", errConnLost, err)
			}
			wrote = nil // a nil channel never answers: wait for the rest
		case r, ok := <-ch:
			if !ok {
				c.mu.Lock()
				err := c.err
				c.mu.Unlock()
				return nil, err
			}
			if r.Error != nil {
				var we *jsonrpc.Error
				if errors.As(r.Error, &we) {
					return nil, rpcError{we}
				}
				return nil, rpcError{&jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: r.Error.Error()}}
			}
			return r.Result, nil
		case <-ctx.Done():
			forget()
			// Tell the backend, so that it stops working for nobody.
			p, _ := json.Marshal(map[string]any{"requestId": n, "reason": "coordd: no caller is left"})
			_ = c.c.Write(context.WithoutCancel(ctx), &jsonrpc.Request{Method: "notifications/cancelled", Params: p})
			return nil, ctx.Err()
		}
	}
}

// watch routes the backend's progress notifications under token (JSON)
// to fn until the returned function is called.
func (c *conn) watch(token string, fn func(json.RawMessage)) func() {
	c.mu.Lock()
	c.prog[token] = fn
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.prog, token)
		c.mu.Unlock()
	}
}

// alive reports whether the connection is still up.
func (c *conn) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

func (c *conn) close() { _ = c.c.Close() }

var tokenSeq atomic.Int64

// newToken returns a progress token (JSON) unique in this process.
func newToken() string { return strconv.Quote("coordd-" + strconv.FormatInt(tokenSeq.Add(1), 10)) }
