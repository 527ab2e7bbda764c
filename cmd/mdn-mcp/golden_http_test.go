package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// httpCorpus is testdata/mcp-golden/http.json: HTTP exchanges at /mcp that
// both servers must answer the same way (its "about" says how).
type httpCorpus struct {
	AllowedOrigins string     `json:"allowedOrigins"`
	Cases          []httpCase `json:"cases"`
}

// httpCase is one exchange of httpCorpus.
type httpCase struct {
	Name    string            `json:"name"`
	Method  string            `json:"method"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	Raw     string            `json:"raw"`
	Status  int               `json:"status"`
	Close   bool              `json:"close"`
	ID      json.RawMessage   `json:"id"`
	Result  bool              `json:"result"`
	Error   int               `json:"error"`
	Message *string           `json:"message"`
}

func readHTTPCorpus(t *testing.T) httpCorpus {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(goldenDir, "http.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c httpCorpus
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Cases) == 0 {
		t.Fatal("http.json has no cases")
	}
	return c
}

// request is the bytes the case sends to host.
func (c httpCase) request(host string) []byte {
	_, port, _ := net.SplitHostPort(host)
	expand := strings.NewReplacer("{host}", host, "{port}", port).Replace
	if c.Raw != "" {
		return []byte(expand(c.Raw))
	}
	method := c.Method
	if method == "" {
		method = http.MethodPost
	}
	h := map[string]string{
		"Host":                 host,
		"Content-Type":         "application/json",
		"Accept":               "application/json, text/event-stream",
		"Mcp-Protocol-Version": "2025-06-18",
	}
	for k, v := range c.Headers {
		h[k] = expand(v)
	}
	if c.Body != "" {
		h["Content-Length"] = fmt.Sprint(len(c.Body))
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\n", method, mcpPath)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %s\r\n", k, h[k])
	}
	b.WriteString("\r\n" + c.Body)
	return b.Bytes()
}

// exchange sends the case to host over a new connection and checks the
// answer against it.
func (c httpCase) exchange(t *testing.T, host string) {
	t.Helper()
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(c.request(host)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	if res.StatusCode != c.Status {
		t.Errorf("status %d; want %d (body %q)", res.StatusCode, c.Status, body)
	}
	if c.Close {
		if !res.Close {
			t.Fatalf("no Connection: close in the answer; headers %v", res.Header)
		}
		if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
			t.Errorf("after the answer: %q, %v; want the connection closed, nothing more", rest, err)
		}
	}
	if c.Result || c.Error != 0 {
		c.checkJSONRPC(t, res.Header.Get("Content-Type"), body)
	}
}

// checkJSONRPC checks the JSON-RPC answer in body (JSON, or the first
// event of an event stream) against the case.
func (c httpCase) checkJSONRPC(t *testing.T, contentType string, body []byte) {
	t.Helper()
	if strings.HasPrefix(contentType, "text/event-stream") {
		var data []byte
		for line := range strings.Lines(string(body)) {
			if d, ok := strings.CutPrefix(line, "data:"); ok {
				data = []byte(strings.TrimSpace(d))
				break
			}
		}
		body = data
	}
	var msg struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		t.Fatalf("answer %q (%s) is no JSON-RPC message: %v", body, contentType, err)
	}
	if msg.JSONRPC != "2.0" || !bytes.Equal(msg.ID, c.ID) {
		t.Errorf("answer %s: jsonrpc %q, id %s; want 2.0, %s", body, msg.JSONRPC, msg.ID, c.ID)
	}
	switch {
	case c.Result && (msg.Result == nil || msg.Error != nil):
		t.Errorf("answer %s; want a result", body)
	case !c.Result && (msg.Error == nil || msg.Error.Code != c.Error):
		t.Errorf("answer %s; want an error with code %d", body, c.Error)
	case !c.Result && c.Message != nil && msg.Error.Message != *c.Message:
		t.Errorf("answer %s; want the message %q", body, *c.Message)
	}
}

// TestGoldenHTTP runs testdata/mcp-golden/http.json against both servers'
// processes: Origin validation, request framing, JSON-RPC conformance.
func TestGoldenHTTP(t *testing.T) {
	mcpBinary(t)
	corpus := readHTTPCorpus(t)
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			argv := append(impl.argv(t), "--http", "127.0.0.1:0", "--coordd", "127.0.0.1:1", "--allowed-origins", corpus.AllowedOrigins)
			r := startReplica(t, impl.name+"-mdn-mcp", nil, argv...)
			host := strings.TrimPrefix(r.url, "http://")
			for _, c := range corpus.Cases {
				t.Run(c.Name, func(t *testing.T) { c.exchange(t, host) })
			}
		})
	}
}

// TestAllowedOriginsEnv: $MDN_MCP_ALLOWED_ORIGINS is the default of
// --allowed-origins, in both servers; without either, every Origin is
// refused.
func TestAllowedOriginsEnv(t *testing.T) {
	mcpBinary(t)
	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			argv := append(impl.argv(t), "--http", "127.0.0.1:0", "--coordd", "127.0.0.1:1")
			env := startReplica(t, impl.name+"-env", []string{"MDN_MCP_ALLOWED_ORIGINS=https://app.example"}, argv...)
			none := startReplica(t, impl.name+"-none", nil, argv...)
			for _, tc := range []struct {
				r      *replica
				origin string
				want   int
			}{
				{env, "https://app.example", http.StatusOK},
				{env, "https://other.example", http.StatusForbidden},
				{none, "https://app.example", http.StatusForbidden},
			} {
				c := httpCase{Headers: map[string]string{"Origin": tc.origin}, Body: ping, Status: tc.want}
				t.Run(tc.r.name+" "+tc.origin, func(t *testing.T) { c.exchange(t, strings.TrimPrefix(tc.r.url, "http://")) })
			}
		})
	}
}

func TestParseOrigins(t *testing.T) {
	tests := []struct {
		name string
		list string
		want []string // nil: an error
	}{
		{"empty", "", []string{}},
		{"two, spaced", " https://app.example , http://localhost:3000", []string{"https://app.example", "http://localhost:3000"}},
		{"case and default ports", "HTTPS://App.Example:443,http://x.example:80,https://y.example:80", []string{"https://app.example", "http://x.example", "https://y.example:80"}},
		{"IPv6", "http://[::1]:8080", []string{"http://[::1]:8080"}},
		{"a path", "https://app.example/", nil},
		{"no scheme", "app.example", nil},
		{"null", "null", nil},
		{"wildcard", "*", nil},
		{"user information", "https://u@app.example", nil},
		{"another scheme", "file://x", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseOrigins(tt.list)
			if tt.want == nil {
				if err == nil || !strings.Contains(err.Error(), "--allowed-origins") {
					t.Errorf("parseOrigins(%q) = %v, %v; want an error naming the flag", tt.list, got, err)
				}
				return
			}
			if err != nil || len(got) != len(tt.want) {
				t.Fatalf("parseOrigins(%q) = %v, %v; want %v", tt.list, got, err, tt.want)
			}
			for _, o := range tt.want {
				if !got[o] {
					t.Errorf("parseOrigins(%q) = %v; want %q in it", tt.list, got, o)
				}
			}
		})
	}
}
