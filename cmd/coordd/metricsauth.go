package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/coordd/coordd/server"
)

// metricsAuthConfig gives the metrics listener (/metrics, /status,
// /debug/pprof) bearer tokens of its own, apart from the tenants': a
// scraper or an operator is no tenant, and a tenant's token must not show
// every tenant's traffic. Required when tenants are configured; its
// tokens come from any of tokens_env, tokens_file and tokens, as a
// tenant's do.
type metricsAuthConfig struct {
	TokensEnv  string   `yaml:"tokens_env"`
	TokensFile string   `yaml:"tokens_file"`
	Tokens     []string `yaml:"tokens"`
}

// metricsTokens returns the metrics listener's tokens: none when it needs
// none (no tenants and no metrics_auth), or an error naming the field.
func (fc *fileConfig) metricsTokens() ([]string, error) {
	ma := fc.MetricsAuth
	if ma == nil {
		if len(fc.Tenants) > 0 && fc.MetricsListen != "" {
			return nil, errors.New("config: metrics_auth: required with tenants, as /metrics and /status show every tenant's traffic: " +
				"give the metrics listener tokens of its own (tokens_env, tokens_file or tokens)")
		}
		return nil, nil
	}
	return readTokens("config: metrics_auth", ma.TokensEnv, ma.TokensFile, ma.Tokens)
}

// readTokens reads the tokens of field from the environment variable env,
// the file (one a line; blank lines and lines starting with # skipped)
// and inline, together; at least one in all, each at least
// server.MinTokenBytes. Every problem is reported (errors.Join), each
// naming where the token came from (tokens_env, tokens_file's line,
// tokens[i]) and its length, never the token.
func readTokens(field, env, file string, inline []string) ([]string, error) {
	var toks []string
	var errs []error
	add := func(where string, tok string) {
		if len(tok) < server.MinTokenBytes {
			errs = append(errs, fmt.Errorf("%s.%s: %d bytes; want at least %d", field, where, len(tok), server.MinTokenBytes))
			return
		}
		toks = append(toks, tok)
	}
	for i, tok := range inline {
		add(fmt.Sprintf("tokens[%d]", i), tok)
	}
	if env != "" {
		if v, ok := os.LookupEnv(env); !ok {
			errs = append(errs, fmt.Errorf("%s.tokens_env: $%s is not set", field, env))
		} else {
			for i, tok := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r' }) {
				add(fmt.Sprintf("tokens_env: token %d of $%s", i+1, env), tok)
			}
		}
	}
	if file != "" {
		if b, err := os.ReadFile(file); err != nil {
			errs = append(errs, fmt.Errorf("%s.tokens_file: %w", field, err))
		} else {
			n := 0
			for line := range strings.Lines(string(b)) {
				n++
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
					add(fmt.Sprintf("tokens_file: %s line %d", file, n), line)
				}
			}
		}
	}
	if len(toks) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%s: no tokens: set tokens_env, tokens_file or tokens", field))
	}
	return toks, errors.Join(errs...)
}

// requireToken wraps h so that every request must carry one of tokens:
// "Authorization: Bearer <token>" (Prometheus's authorization or
// bearer_token_file, curl -H), or HTTP Basic with the token as the
// password and any user name, which a browser asks for by itself and then
// sends with the status page's refreshes. No tokens: h as it is.
func requireToken(tokens []string, h http.Handler) http.Handler {
	if len(tokens) == 0 {
		return h
	}
	// Compare digests, in constant time, so that neither a token's bytes
	// nor its length leak through timing.
	sums := make([][32]byte, len(tokens))
	for i, t := range tokens {
		sums[i] = sha256.Sum256([]byte(t))
	}
	valid := func(tok string) bool {
		got := sha256.Sum256([]byte(tok))
		ok := 0
		for _, s := range sums {
			ok |= subtle.ConstantTimeCompare(got[:], s[:])
		}
		return tok != "" && ok == 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if valid(presentedToken(r)) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Add("WWW-Authenticate", `Basic realm="coordd metrics", charset="UTF-8"`)
		w.Header().Add("WWW-Authenticate", `Bearer realm="coordd metrics"`)
		http.Error(w, "a metrics token is required (metrics_auth)", http.StatusUnauthorized)
	})
}

// presentedToken is the token r carries: a bearer token, or a Basic
// password; "" if none.
func presentedToken(r *http.Request) string {
	scheme, rest, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok {
		return ""
	}
	switch strings.ToLower(scheme) {
	case "bearer":
		return strings.TrimSpace(rest)
	case "basic":
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
		if err != nil {
			return ""
		}
		_, pw, _ := strings.Cut(string(b), ":")
		return pw
	}
	return ""
}
