package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// backend is one configured server and its connections: a pool of
// processes (or one remote session) per credential scope.
type backend struct {
	g   *Gateway
	cfg *Server
	log *slog.Logger
	env map[string]string // cfg.Env, loaded

	mu    sync.Mutex
	pools map[string]*pool // by credential id ("" none)

	lists sync.Map // listKey -> *listEntry: tools/list and the like, cached briefly

	lastInit   atomic.Pointer[json.RawMessage] // the server's last initialize result
	version    atomic.Pointer[string]          // the protocol version agreed with it last
	executions atomic.Int64                    // calls sent to the server, for tests and metrics
	starts     atomic.Int64                    // processes started or sessions opened
}

// cred is a credential scope's secret towards a backend: environment
// variables for a stdio server, a header for a remote one. id names it
// without revealing it ("" for none).
type cred struct {
	id     string
	env    map[string]string
	header string
	value  string
}

// envHeader carries a tenant's environment for a stdio server from the
// engine's fetch to the gateway's transport, inside this process only.
const envHeader = "X-Coordd-Mcp-Env"

// credOf decodes the credential the engine sends with a fetch (header
// h), or that a caller's scope holds.
func (b *backend) credOf(h http.Header) (cred, error) {
	if b.cfg.URL != "" {
		name := "Authorization"
		if b.cfg.Credential != nil && b.cfg.Credential.Header != "" {
			name = b.cfg.Credential.Header
		}
		v := h.Get(name)
		if v == "" {
			return cred{}, nil
		}
		return cred{id: credID(v), header: name, value: v}, nil
	}
	v := h.Get(envHeader)
	if v == "" {
		return cred{}, nil
	}
	raw, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return cred{}, errors.New("malformed environment credential")
	}
	var env map[string]string
	if err := json.Unmarshal(raw, &env); err != nil {
		return cred{}, errors.New("malformed environment credential")
	}
	return cred{id: credID(v), env: env}, nil
}

// encodeEnv is the value of envHeader for env.
func encodeEnv(env map[string]string) string {
	b, _ := json.Marshal(env) // sorted keys: the same env, the same id
	return base64.StdEncoding.EncodeToString(b)
}

func credID(v string) string {
	s := sha256.Sum256([]byte("coordd-mcp-credential\x00" + v))
	return hex.EncodeToString(s[:12])
}

// pool is the connections of one credential scope.
type pool struct {
	b     *backend
	cred  cred
	slots []*slot
	rr    atomic.Uint64
}

// slot is one process (or remote session) of a pool, started when first
// needed and started again, with backoff, after it ends.
type slot struct {
	mu      sync.Mutex
	c       *conn
	fails   int       // starts failed in a row
	retryAt time.Time // no start before it, after a failure
}

func (b *backend) poolFor(cr cred) *pool {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.pools[cr.id]
	if p == nil {
		n := max(b.cfg.Processes, 1)
		p = &pool{b: b, cred: cr, slots: make([]*slot, n)}
		for i := range p.slots {
			p.slots[i] = &slot{}
		}
		b.pools[cr.id] = p
	}
	return p
}

// conn returns a live connection of the pool, starting one if needed;
// skip is one not to use again (a connection that just failed).
func (p *pool) conn(ctx context.Context, skip *conn) (*conn, error) {
	n := len(p.slots)
	start := int(p.rr.Add(1))
	var firstErr error
	for i := range n {
		s := p.slots[(start+i)%n]
		c, err := s.get(ctx, p, skip)
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, firstErr
}

func (s *slot) get(ctx context.Context, p *pool, skip *conn) (*conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil && s.c.alive() && s.c != skip {
		return s.c, nil
	}
	if s.c != nil && s.c == skip && s.c.alive() {
		return nil, errors.New("skipped")
	}
	if s.c != nil {
		s.c.close()
		s.c = nil
		p.b.g.m.restart(p.b.cfg.Name)
	}
	if wait := time.Until(s.retryAt); wait > 0 {
		return nil, fmt.Errorf("%w: %s failed to start; next try in %v", errConnLost, p.b.cfg.Name, wait.Round(time.Millisecond))
	}
	c, err := p.b.dial(ctx, p.cred, poolCapabilities)
	if err != nil {
		s.fails++
		s.retryAt = time.Now().Add(restartBackoff(s.fails))
		p.b.log.Warn("mcp server did not start", "server", p.b.cfg.Name, "err", err, "failures", s.fails)
		return nil, fmt.Errorf("%w: %s: %v", errConnLost, p.b.cfg.Name, err)
	}
	s.fails, s.c = 0, c
	return c, nil
}

// restartBackoff is the wait before the next start after n failures in
// a row: 100ms doubling, at most 5s (the breaker, shared by the fleet,
// is what stops calls to a server that stays down).
func restartBackoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n-1, 6)
	return min(d, 5*time.Second)
}

// dial starts a process or opens a remote session for cr, declaring
// caps to it.
func (b *backend) dial(ctx context.Context, cr cred, caps json.RawMessage) (*conn, error) {
	var t mcp.Transport
	if b.cfg.URL != "" {
		t = &mcp.StreamableClientTransport{Endpoint: b.cfg.URL, HTTPClient: &http.Client{Transport: &remoteHeaders{cred: cr, next: b.g.httpTransport}}, MaxRetries: -1}
	} else {
		cmd := exec.Command(b.cfg.Command[0], b.cfg.Command[1:]...)
		cmd.Env = os.Environ()
		keys := make([]string, 0, len(b.env)+len(cr.env))
		vals := map[string]string{}
		for k, v := range b.env {
			vals[k] = v
		}
		for k, v := range cr.env {
			vals[k] = v // the scope's own overrides the server's
		}
		for k := range vals {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			cmd.Env = append(cmd.Env, k+"="+vals[k])
		}
		cmd.Stderr = &stderrLog{log: b.log, server: b.cfg.Name}
		t = &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	}
	b.starts.Add(1)
	c, err := dial(b.g.ctx, t, b.cfg.InitTimeout, b.log, caps, func(method string) { b.notified(cr, method) })
	if err != nil {
		return nil, err
	}
	b.version.Store(&c.version)
	b.g.m.process(b.cfg.Name, 1)
	go func() {
		<-c.done
		b.g.m.process(b.cfg.Name, -1)
	}()
	return c, nil
}

// notified handles a backend's notification: a list changed, so its
// cached copy goes.
func (b *backend) notified(cr cred, method string) {
	// Which cached answers a notification makes out of date.
	stale := map[string][]string{
		"notifications/tools/list_changed":     {"tools/list"},
		"notifications/prompts/list_changed":   {"prompts/list", "prompts/get"},
		"notifications/resources/list_changed": {"resources/list", "resources/templates/list", "resources/read"},
		"notifications/resources/updated":      {"resources/read"},
	}[method]
	b.lists.Range(func(k, _ any) bool {
		if lk := k.(listKey); lk.cred == cr.id && slices.Contains(stale, lk.method) {
			b.lists.Delete(k)
		}
		return true
	})
}

func (b *backend) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.pools {
		for _, s := range p.slots {
			s.mu.Lock()
			if s.c != nil {
				s.c.close()
			}
			s.mu.Unlock()
		}
	}
}

// remoteHeaders adds a credential scope's header and the agreed protocol
// version to every request of a remote session, and tells the call that
// made a request what the server answered (for 429s and quotas).
type remoteHeaders struct {
	cred cred
	next http.RoundTripper
}

type answerKey struct{}

// answer is what a remote server answered to the POST of one call.
type answer struct {
	mu     sync.Mutex
	status int
	header http.Header
}

// code is the status the server answered (0: none, or not remote).
func (a *answer) code() int {
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status
}

func (r *remoteHeaders) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.cred.header != "" {
		req = req.Clone(req.Context())
		req.Header.Set(r.cred.header, r.cred.value)
	}
	resp, err := r.next.RoundTrip(req)
	if a, ok := req.Context().Value(answerKey{}).(*answer); ok && err == nil {
		a.mu.Lock()
		a.status, a.header = resp.StatusCode, resp.Header.Clone()
		a.mu.Unlock()
	}
	return resp, err
}

// stderrLog passes a backend's stderr to the log, bounded: a server that
// floods it costs a line a write, at most 512 bytes each, and at most
// one line per 10ms.
type stderrLog struct {
	log    *slog.Logger
	server string
	mu     sync.Mutex
	last   time.Time
}

func (s *stderrLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	now := time.Now()
	ok := now.Sub(s.last) >= 10*time.Millisecond
	if ok {
		s.last = now
	}
	s.mu.Unlock()
	if ok {
		line := p[:min(len(p), 512)]
		s.log.Debug("mcp server stderr", "server", s.server, "line", string(line))
	}
	return len(p), nil
}
