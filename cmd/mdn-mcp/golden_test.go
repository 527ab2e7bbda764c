package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"os"
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
	if _, err := newServer(m, version).Connect(ctx, st, nil); err != nil {
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

// TestGoldenTools: tools/list gives testdata/mcp-golden/tools.json (names,
// titles, descriptions, input schemas without extra properties,
// annotations), which the TypeScript server must give too (go test -run
// TestGoldenTools -update rewrites it).
func TestGoldenTools(t *testing.T) {
	base, _ := url.Parse("https://mdn.test")
	cs := inMemory(t, &mdn{docs: &stubGetter{}, base: base, coordd: "coordd.test:1", log: discardLogger()})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(res.Tools, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join(goldenDir, "tools.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, got, want) {
		t.Errorf("tools/list differs from %s; got:\n%s", golden, got)
	}
	for _, tool := range res.Tools {
		if s, _ := json.Marshal(tool.InputSchema); !strings.Contains(string(s), `"additionalProperties":false`) {
			t.Errorf("%s input schema %s; want additionalProperties false", tool.Name, s)
		}
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
