package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// issueConfig is the configuration of credentials as docs/apis.md shows
// it, pointed at a local url; every test and tool reads the same names.
const issueConfig = `
credential_scope_key_env: COORDD_SCOPE_KEY
upstreams:
  - name: github
    base_url: "http://127.0.0.1:1/"
    credential: {header: Authorization, value_env: GITHUB_TOKEN}
    request_headers: {User-Agent: "coordd", X-GitHub-Api-Version: "2022-11-28"}
    forward_headers: [Accept]
    caller_credentials: false
tenants:
  - name: team-a
    tokens_env: TEAM_A_TOKENS
    upstreams: [github]
    credentials:
      github: {header: Authorization, value_env: TEAM_A_GITHUB_TOKEN}
metrics_auth:
  tokens_env: METRICS_TOKENS
`

// TestCredentialConfig: the configuration of credentials starts; a
// missing variable, a value with a CR or LF, a credential for an upstream
// not granted, or Redis without the scope key fails the start naming the
// field, never the value.
func TestCredentialConfig(t *testing.T) {
	bin := coorddBinary(t, "")
	dir := t.TempDir()
	const canary = "Bearer ghp_canary0123456789abcdef"
	good := []string{
		"COORDD_SCOPE_KEY=scope-key-0123456789abcdef", "GITHUB_TOKEN=" + canary, "TEAM_A_TOKENS=team-a-token-0123456789",
		"TEAM_A_GITHUB_TOKEN=" + canary + "-team", "METRICS_TOKENS=metrics-token-0123456789",
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := write("coordd.yaml", issueConfig)
	with := func(env []string, kv ...string) []string {
		out := append([]string(nil), env...)
		for _, s := range kv {
			name, _, _ := strings.Cut(s, "=")
			for i, e := range out {
				if strings.HasPrefix(e, name+"=") {
					out = append(out[:i], out[i+1:]...)
					break
				}
			}
			if strings.Contains(s, "=") {
				out = append(out, s)
			}
		}
		return out
	}
	tests := []struct {
		name    string
		env     []string
		args    []string
		wantErr string // "" for ok
	}{
		{"as documented", good, nil, ""},
		{"upstream token missing", with(good, "GITHUB_TOKEN"), nil, "upstreams[0] (github).credential.value_env: the environment variable GITHUB_TOKEN is not set"},
		{"tenant token missing", with(good, "TEAM_A_GITHUB_TOKEN"), nil, "tenants[0] (team-a).credentials.github.value_env: the environment variable TEAM_A_GITHUB_TOKEN is not set"},
		{"token with LF", with(good, "GITHUB_TOKEN="+canary+"\nX-Evil: 1"), nil, "holds a CR or LF"},
		{"token with CR", with(good, "TEAM_A_GITHUB_TOKEN="+canary+"\r"), nil, "holds a CR or LF"},
		{"redis without the scope key", with(good, "COORDD_SCOPE_KEY"), []string{"--redis", "redis://127.0.0.1:1"}, "COORDD_SCOPE_KEY is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--config", cfg, "--check-config"}, tt.args...)
			code, stdout, stderr := runBinary(t, bin, tt.env, args...)
			out := stdout + stderr
			if strings.Contains(out, "canary") {
				t.Errorf("output quotes the credential:\n%s", out)
			}
			if tt.wantErr == "" {
				if code != 0 {
					t.Fatalf("exit %d; want 0\n%s", code, out)
				}
				return
			}
			if code == 0 || !strings.Contains(out, tt.wantErr) {
				t.Fatalf("exit %d, output:\n%s\nwant an error containing %q", code, out, tt.wantErr)
			}
		})
	}
	// Without credential_scope_key_env, Redis is refused once a
	// credential exists: instances would draw different keys.
	noKey := write("nokey.yaml", strings.Replace(issueConfig, "credential_scope_key_env: COORDD_SCOPE_KEY\n", "", 1))
	code, stdout, stderr := runBinary(t, bin, good, "--config", noKey, "--check-config", "--redis", "redis://127.0.0.1:1")
	if code == 0 || !strings.Contains(stdout+stderr, "credential_scope_key_env: required with Redis") {
		t.Fatalf("no scope key with redis: exit %d\n%s%s", code, stdout, stderr)
	}
	if code, stdout, stderr := runBinary(t, bin, good, "--config", noKey, "--check-config"); code != 0 {
		t.Fatalf("no scope key, single node: exit %d; want 0\n%s%s", code, stdout, stderr)
	}
}
