package upstream

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestCredentialLoad: a missing variable or unreadable file, or a value
// with CR or LF, fails the start naming the field and where the value
// comes from, never the value.
func TestCredentialLoad(t *testing.T) {
	const canary = "Bearer canary-0123456789"
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("CRED_OK", canary)
	t.Setenv("CRED_LF", canary+"\nX-Evil: 1")
	t.Setenv("CRED_CR", canary+"\r")
	t.Setenv("CRED_EMPTY", "")
	tests := []struct {
		name    string
		c       Credential
		wantErr string // "" for none
	}{
		{"env", Credential{ValueEnv: "CRED_OK"}, ""},
		{"file with a trailing newline", Credential{Header: "x-api-key", ValueFile: write("ok", canary+"\n")}, ""},
		{"env missing", Credential{ValueEnv: "CRED_MISSING"}, "up.credential.value_env: the environment variable CRED_MISSING is not set"},
		{"env empty", Credential{ValueEnv: "CRED_EMPTY"}, "is empty"},
		{"env with LF", Credential{ValueEnv: "CRED_LF"}, "holds a CR or LF"},
		{"env with CR", Credential{ValueEnv: "CRED_CR"}, "holds a CR or LF"},
		{"file with LF inside", Credential{ValueFile: write("lf", canary+"\nmore\n")}, "holds a CR or LF"},
		{"file missing", Credential{ValueFile: filepath.Join(dir, "nope")}, "cannot read " + filepath.Join(dir, "nope")},
		{"both", Credential{ValueEnv: "CRED_OK", ValueFile: write("both", canary)}, "exactly one of value_env and value_file"},
		{"neither", Credential{}, "exactly one of value_env and value_file"},
		{"bad header", Credential{Header: "Bad Header", ValueEnv: "CRED_OK"}, "not a header name"},
		{"reserved header", Credential{Header: "Cookie", ValueEnv: "CRED_OK"}, "cannot carry a credential"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Load("up.credential", nil)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := tt.c.Value().Reveal(); got != canary {
					t.Fatalf("value %q; want the canary", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Load = %v; want an error containing %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "canary") {
				t.Fatalf("error %q quotes the value", err)
			}
		})
	}
}

// TestCredentialFileReload: a changed file is picked up; one that turns
// bad is not, the last good value stays and a WARN names the file.
func TestCredentialFileReload(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte("Bearer first-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	c := &Credential{ValueFile: p}
	if err := c.Load("upstreams[0] (gh).credential", slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	// The file is looked at at most once a second: this test's clock is
	// the source's next-look time, set to now instead of waited for.
	change := func(content string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		// A different size, or a later mtime, marks the change.
		c.src.next.Store(0)
	}
	change("Bearer second-0123456789-longer\n")
	if got := c.Value().Reveal(); got != "Bearer second-0123456789-longer" {
		t.Fatalf("after a change: %q", got)
	}
	change("Bearer third\nX-Evil: injected-0123456789\n")
	if got := c.Value().Reveal(); got != "Bearer second-0123456789-longer" {
		t.Fatalf("after a bad change: %q; want the last good value", got)
	}
	out := logs.String()
	if !strings.Contains(out, "credential file not reloaded") || !strings.Contains(out, p) || strings.Contains(out, "third") || strings.Contains(out, "second-") {
		t.Fatalf("log %q: want a WARN naming %s and no value", out, p)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCredentialStaysInsideUpstream: the credential and the configured
// headers go with every request and every redirect followed inside the
// upstream's base url, and never to a redirect target outside it, which is
// not requested at all.
func TestCredentialStaysInsideUpstream(t *testing.T) {
	const token = "Bearer inside-0123456789"
	var mu sync.Mutex
	outside := 0
	out := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		outside++
		mu.Unlock()
	}))
	defer out.Close()
	seen := map[string]http.Header{}
	in := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = r.Header.Clone()
		mu.Unlock()
		switch r.URL.Path {
		case "/api/start":
			http.Redirect(w, r, "/api/next", http.StatusFound)
		case "/api/next":
			http.Redirect(w, r, "/other/x", http.StatusFound) // outside the base path
		case "/api/away":
			http.Redirect(w, r, out.URL+"/api/x", http.StatusFound) // another host
		}
	}))
	defer in.Close()
	t.Setenv("TOKEN_TEST", token)
	up := Config{Name: "api", BaseURL: in.URL + "/api/", Credential: &Credential{ValueEnv: "TOKEN_TEST"},
		RequestHeaders: map[string]string{"user-agent": "coordd-test", "X-Api-Version": "3"}}
	SetDefaults(&up)
	if err := Validate(&up, "upstreams[0]"); err != nil {
		t.Fatal(err)
	}
	if err := up.Credential.Load("upstreams[0].credential", nil); err != nil {
		t.Fatal(err)
	}
	cl := NewClient(&up, Options{})
	for _, path := range []string{"/api/start", "/api/away"} {
		hdr := http.Header{up.CredentialHeader(): {up.Credential.Value().Reveal()}, "Accept": {"application/json"}}
		resp, err := cl.Fetch(context.Background(), FetchRequest{URL: in.URL + path, Header: hdr}, nil)
		if err != nil || resp.StatusCode != http.StatusFound {
			t.Fatalf("%s: %v, %v; want the redirect leaving the upstream delivered as it is", path, resp, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, path := range []string{"/api/start", "/api/next", "/api/away"} {
		h := seen[path]
		if h.Get("Authorization") != token || h.Get("User-Agent") != "coordd-test" || h.Get("X-Api-Version") != "3" || h.Get("Accept") != "application/json" {
			t.Errorf("%s got headers %v; want the credential, the configured and the forwarded ones", path, h)
		}
	}
	if _, ok := seen["/other/x"]; ok || outside != 0 {
		t.Errorf("a redirect outside the upstream was requested (path %v, other host %d times)", ok, outside)
	}
}
