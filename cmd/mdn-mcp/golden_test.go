package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordd "github.com/coordd/coordd/clients/go"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	buildinfo "github.com/coordd/coordd/internal/version"
)

// errorCase is one case of testdata/mcp-golden/errors.json.
type errorCase struct {
	Name              string         `json:"name"`
	Tool              string         `json:"tool"`
	Arguments         map[string]any `json:"arguments"`
	Coordd            *stubAnswer    `json:"coordd"`
	Text              *string        `json:"text"`
	TextPrefix        *string        `json:"textPrefix"`
	RetryAfterSeconds *int           `json:"retryAfterSeconds"`
}

// stubAnswer is what stubGetter answers.
type stubAnswer struct {
	Status            int32   `json:"status"`
	Body              string  `json:"body"`
	Code              string  `json:"code"`
	Message           string  `json:"message"`
	RetryDelaySeconds float64 `json:"retryDelaySeconds"`
}

// stubGetter answers every Get with its answer; a nil answer fails.
type stubGetter struct {
	answer *stubAnswer
	calls  int
}

func (g *stubGetter) Get(_ context.Context, _ string, _ ...coordd.CallOption) (*coordd.Document, error) {
	g.calls++
	a := g.answer
	if a == nil {
		return nil, errors.New("coordd must not be asked")
	}
	if a.Code != "" {
		code, ok := map[string]codes.Code{
			"UNAVAILABLE": codes.Unavailable, "RESOURCE_EXHAUSTED": codes.ResourceExhausted,
			"PERMISSION_DENIED": codes.PermissionDenied, "UNAUTHENTICATED": codes.Unauthenticated,
			"DEADLINE_EXCEEDED": codes.DeadlineExceeded, "INTERNAL": codes.Internal,
		}[a.Code]
		if !ok {
			return nil, errors.New("unknown code " + a.Code)
		}
		st := status.New(code, a.Message)
		if a.RetryDelaySeconds > 0 {
			d := time.Duration(a.RetryDelaySeconds * float64(time.Second))
			st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		}
		// Wrapped, as the client's retry loop may return it.
		return nil, &wrapped{st.Err()}
	}
	code := a.Status
	if code == 0 {
		code = 200
	}
	return &coordd.Document{Body: []byte(a.Body), Metadata: &coorddv1.Metadata{StatusCode: code}}, nil
}

type wrapped struct{ err error }

func (w *wrapped) Error() string { return "coordd: after 3 attempts: " + w.err.Error() }
func (w *wrapped) Unwrap() error { return w.err }

// inMemory connects a client to newServer over in-memory transports.
func inMemory(t *testing.T, m *mdn) *mcp.ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	if _, err := newServer(m, buildinfo.Current()).Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "golden", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestGoldenErrors runs testdata/mcp-golden/errors.json, which the
// TypeScript server's tests run too: the same tool errors, byte for byte.
func TestGoldenErrors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "errors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var corpus struct {
		Cases []errorCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &corpus); err != nil {
		t.Fatal(err)
	}
	base, _ := url.Parse("https://mdn.test")
	for _, tc := range corpus.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			g := &stubGetter{answer: tc.Coordd}
			cs := inMemory(t, &mdn{docs: g, base: base, coordd: "coordd.test:1", log: discardLogger()})
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tc.Tool, Arguments: tc.Arguments})
			if err != nil {
				t.Fatalf("protocol error: %v", err)
			}
			var text string
			for _, c := range res.Content {
				if tc, ok := c.(*mcp.TextContent); ok {
					text += tc.Text
				}
			}
			if !res.IsError {
				t.Errorf("isError false; text %q", text)
			}
			switch {
			case tc.Text != nil && text != *tc.Text:
				t.Errorf("text\n%s\nwant\n%s", text, *tc.Text)
			case tc.TextPrefix != nil && !strings.HasPrefix(text, *tc.TextPrefix):
				t.Errorf("text %q; want it to start with %q", text, *tc.TextPrefix)
			}
			var got struct {
				RetryAfterSeconds *int `json:"retryAfterSeconds"`
			}
			if res.StructuredContent != nil {
				b, _ := json.Marshal(res.StructuredContent)
				json.Unmarshal(b, &got)
			}
			if (got.RetryAfterSeconds == nil) != (tc.RetryAfterSeconds == nil) || (got.RetryAfterSeconds != nil && *got.RetryAfterSeconds != *tc.RetryAfterSeconds) {
				t.Errorf("structuredContent %v; want retryAfterSeconds %v", res.StructuredContent, tc.RetryAfterSeconds)
			}
			if tc.Coordd == nil && g.calls > 0 {
				t.Errorf("coordd asked %d times; want none", g.calls)
			}
		})
	}
}

// toolsCorpus is testdata/mcp-golden/tools.json: tools/list's whole
// result after initialize at ProtocolVersion, as both servers must send it.
type toolsCorpus struct {
	About           string          `json:"about"`
	ProtocolVersion string          `json:"protocolVersion"`
	Result          json.RawMessage `json:"result"`
}

// listToolsRaw opens an MCP session at version over a connection carrying
// newline-delimited JSON-RPC (stdio, a pipe), w to the server and r from
// it, then sends tools/list and returns its result as the wire carried it.
func listToolsRaw(w io.Writer, r io.Reader, version string) (json.RawMessage, error) {
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 64<<10), 4<<20)
	// await reads messages up to the answer to id; notifications pass.
	await := func(id string) (json.RawMessage, error) {
		for lines.Scan() {
			var m struct {
				ID     json.RawMessage `json:"id"`
				Result json.RawMessage `json:"result"`
				Error  json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
				return nil, fmt.Errorf("%q is no JSON-RPC message: %v", lines.Bytes(), err)
			}
			if string(m.ID) != id {
				continue
			}
			if m.Error != nil {
				return nil, fmt.Errorf("request %s: error %s", id, m.Error)
			}
			return m.Result, nil
		}
		return nil, fmt.Errorf("no answer to request %s: %v", id, cmp.Or(lines.Err(), io.ErrUnexpectedEOF))
	}
	send := func(msgs ...string) error {
		_, err := io.WriteString(w, strings.Join(msgs, "\n")+"\n")
		return err
	}
	if err := send(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"golden","version":"0"}}}`, version)); err != nil {
		return nil, err
	}
	init, err := await("1")
	if err != nil {
		return nil, err
	}
	var ir struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := json.Unmarshal(init, &ir); err != nil || ir.ProtocolVersion != version {
		return nil, fmt.Errorf("initialize answered %s; want protocolVersion %s", init, version)
	}
	if err := send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); err != nil {
		return nil, err
	}
	return await("2")
}

// TestGoldenTools: tools/list's whole result, as the wire carries it
// after initialize at the version in testdata/mcp-golden/tools.json, is
// that file's result: from the Go server in memory, and from both
// servers' processes on stdio (go test -run TestGoldenTools -update
// rewrites it from the Go server). Names, titles, descriptions, input
// schemas without extra properties and annotations; no $schema (2020-12,
// the default dialect), no execution, no cache hints.
func TestGoldenTools(t *testing.T) {
	golden := filepath.Join(goldenDir, "tools.json")
	raw, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	var corpus toolsCorpus
	if err := json.Unmarshal(raw, &corpus); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, got json.RawMessage) {
		t.Helper()
		if !jsonEqual(t, got, corpus.Result) {
			var b bytes.Buffer
			json.Indent(&b, got, "", "  ")
			t.Errorf("tools/list result differs from %s; got:\n%s", golden, b.Bytes())
		}
	}

	t.Run("go in memory", func(t *testing.T) {
		base, _ := url.Parse("https://mdn.test")
		s := newServer(&mdn{docs: &stubGetter{}, base: base, coordd: "coordd.test:1", log: discardLogger()}, buildinfo.Current())
		client, server := net.Pipe()
		ss, err := s.Connect(context.Background(), &mcp.IOTransport{Reader: server, Writer: server}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ss.Close()
		defer client.Close()
		client.SetDeadline(time.Now().Add(30 * time.Second))
		got, err := listToolsRaw(client, client, corpus.ProtocolVersion)
		if err != nil {
			t.Fatal(err)
		}
		if *update {
			corpus.Result = got
			b, err := json.MarshalIndent(corpus, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(golden, append(b, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		check(t, got)
		var res mcp.ListToolsResult
		if err := json.Unmarshal(got, &res); err != nil {
			t.Fatal(err)
		}
		for _, tool := range res.Tools {
			if s, _ := json.Marshal(tool.InputSchema); !strings.Contains(string(s), `"additionalProperties":false`) {
				t.Errorf("%s input schema %s; want additionalProperties false", tool.Name, s)
			}
		}
	})
	for _, impl := range implementations {
		t.Run(impl.name+" stdio", func(t *testing.T) {
			mcpBinary(t)
			argv := append(impl.argv(t), "--coordd", "127.0.0.1:1")
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = raceEnv()
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stopped := false
			stop := func() {
				if !stopped {
					stopped = true
					stdin.Close()
					cmd.Process.Kill()
					cmd.Wait()
				}
			}
			defer stop()
			type answer struct {
				result json.RawMessage
				err    error
			}
			done := make(chan answer, 1)
			go func() {
				got, err := listToolsRaw(stdin, stdout, corpus.ProtocolVersion)
				done <- answer{got, err}
			}()
			var a answer
			select {
			case a = <-done:
			case <-time.After(time.Minute): // a hung server; node's start included
				stop()
				a = <-done
			}
			if a.err != nil {
				stop()
				t.Fatalf("%v; stderr:\n%s", a.err, stderr.Bytes())
			}
			check(t, a.result)
		})
	}
}

// TestToolsListCacheHintsSince20260728: a go-sdk client that speaks MCP
// 2026-07-28 (its default) still gets the go-sdk's tools/list, with the
// cache hints that version requires; only older sessions get the
// 2025-11-25 shape of tools.json.
func TestToolsListCacheHintsSince20260728(t *testing.T) {
	base, _ := url.Parse("https://mdn.test")
	cs := inMemory(t, &mdn{docs: &stubGetter{}, base: base, coordd: "coordd.test:1", log: discardLogger()})
	if v := cs.InitializeResult().ProtocolVersion; v < cacheHintsSince {
		t.Fatalf("negotiated %s; want %s or later", v, cacheHintsSince)
	}
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.CacheScope != "public" || len(res.Tools) != 2 {
		t.Errorf("tools/list = cacheScope %q, %d tools; want the go-sdk's public hint and 2 tools", res.CacheScope, len(res.Tools))
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
