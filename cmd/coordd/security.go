package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/upstream"
	"github.com/coordd/coordd/server"
)

// securityConfig holds who may call coordd, and how it talks TLS, inline
// in fileConfig. docs/configuration.md ("Security") documents each field. No field
// holds a secret that is logged: token values and passwords are read from
// the environment or from files, and error messages name the field, never
// the value.
type securityConfig struct {
	// Tenants, when any, require a bearer token on every call to
	// CoordinatorService. Default: none, and no authentication.
	Tenants []tenantConfig `yaml:"tenants"`
	// Reflection registers gRPC server reflection. Default: true.
	Reflection *bool `yaml:"reflection"`
	// TLS serves gRPC over TLS. Default: plaintext.
	TLS *tlsConfig `yaml:"tls"`
	// RedisTLSCAFile is a PEM file of the CAs that sign Redis's
	// certificate, for a rediss:// URL (or redis_cluster). Default: the
	// system's roots.
	RedisTLSCAFile string `yaml:"redis_tls_ca_file"`
	// RedisTLS turns TLS on towards redis_cluster's nodes (a single Redis
	// takes it from its rediss:// URL). Default: false, or true when
	// redis_tls_ca_file is set.
	RedisTLS bool `yaml:"redis_tls"`
	// RedisPasswordEnv names the environment variable holding the Redis
	// password (AUTH, or the ACL user's, with the user from the URL); it
	// overrides a password in the URL. Default: the URL's, if any.
	RedisPasswordEnv string `yaml:"redis_password_env"`
	// CredentialScopeKeyEnv names the environment variable holding the
	// fleet-wide secret (at least 16 bytes) that keys the cache ids of
	// documents fetched with a credential (coordinator.Config.CredentialScopeKey).
	// Required with Redis once any credential exists. Default: none.
	CredentialScopeKeyEnv string `yaml:"credential_scope_key_env"`
}

// tenantConfig is one tenant. Its tokens come from any of tokens_env,
// tokens_file and tokens, together; at least one token in all.
type tenantConfig struct {
	Name string `yaml:"name"`
	// TokensEnv names an environment variable holding the tenant's tokens,
	// separated by commas or white space.
	TokensEnv string `yaml:"tokens_env"`
	// TokensFile is a file holding the tenant's tokens, one a line; blank
	// lines and lines starting with # are skipped.
	TokensFile string `yaml:"tokens_file"`
	// Tokens are the tenant's tokens written in the configuration itself:
	// for tests and development, as anyone who reads the file has them.
	Tokens []string `yaml:"tokens"`
	// Upstreams the tenant may use, by name; ["*"] for all. Required, so
	// that a grant is never implicit.
	Upstreams []string `yaml:"upstreams"`
	// Admin allows the tenant to Invalidate its own documents. Default: false.
	Admin bool `yaml:"admin"`
	// Credentials are the tenant's own credentials, by upstream name (an
	// upstream it is granted): its calls send them instead of the
	// upstream's credential.
	// An entry for a stdio MCP server of mcp_servers is instead the
	// environment its processes get for this tenant ({VAR: {value_env: X}}),
	// and one for a remote MCP server its credential (docs/gateway.md).
	Credentials map[string]*tenantCredential `yaml:"credentials"`
	// MCPServers the tenant may use through the MCP gateway, by name.
	// Default: none.
	MCPServers []string `yaml:"mcp_servers"`
	// Weight is the tenant's share of an upstream's slots while fetches of
	// several tenants wait for them: weight 2 gets twice the slots of
	// weight 1, and a share nobody uses goes to whoever waits. 1..1000.
	// Default: 1 (defaultWeight).
	Weight *int `yaml:"weight"`
}

// defaultWeight is a tenant's weight when its configuration gives none.
const defaultWeight = 1

// tlsConfig is the gRPC listener's TLS.
type tlsConfig struct {
	CertFile string `yaml:"cert_file"` // PEM certificate chain; required
	KeyFile  string `yaml:"key_file"`  // PEM private key; required
	// ClientCAFile, when set, requires every client to present a
	// certificate signed by one of its CAs (mutual TLS).
	ClientCAFile string `yaml:"client_ca_file"`
}

// serverOptions returns the server and gRPC options that security asks
// for, the TLS configuration of the HTTP door (nil: plaintext), the
// gRPC listener's, and the certificates both serve (nil: plaintext), for
// the metrics. upstreams are the configured upstreams' names, which
// every tenant's grant must name.
func (sc *securityConfig) serverOptions(log *slog.Logger, upstreams, mcpServers []string) ([]server.Option, []grpc.ServerOption, *tls.Config, *certReloader, error) {
	var sopts []server.Option
	var gopts []grpc.ServerOption
	var httpTLS *tls.Config
	var certs *certReloader
	if sc.Reflection != nil {
		sopts = append(sopts, server.WithReflection(*sc.Reflection))
	}
	var tenantsErr error // reported with tls's, if any: every error at once
	if len(sc.Tenants) > 0 {
		tenants, err := sc.tenants(upstreams, mcpServers, log)
		if err == nil {
			var a *server.Auth
			if a, err = server.NewAuth(tenants); err != nil {
				err = fmt.Errorf("config: %w", err)
			} else {
				sopts = append(sopts, server.WithAuth(a))
			}
		}
		tenantsErr = err
		if sc.TLS == nil {
			log.Warn("tenants are configured without tls: bearer tokens cross the network in clear text")
		}
	}
	if sc.TLS != nil {
		cfg, r, err := sc.TLS.serverTLS(log)
		if err != nil {
			return nil, nil, nil, nil, errors.Join(tenantsErr, err)
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(cfg)))
		httpTLS = withHTTP1(cfg)
		certs = r
	}
	if tenantsErr != nil {
		return nil, nil, nil, nil, tenantsErr
	}
	return sopts, gopts, httpTLS, certs, nil
}

// withHTTP1 returns cfg for the HTTP door: the same certificates, client
// CAs and reloading, offering HTTP/1.1 beside h2 in ALPN.
func withHTTP1(cfg *tls.Config) *tls.Config {
	protos := []string{"h2", "http/1.1"}
	out := cfg.Clone()
	out.NextProtos = protos
	if get := cfg.GetConfigForClient; get != nil {
		out.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(hello)
			if err != nil || c == nil {
				return c, err
			}
			c = c.Clone()
			c.NextProtos = protos
			return c, nil
		}
	}
	return out
}

// tenants reads every tenant's tokens and credentials and checks its
// grant. The error names every bad field of every tenant, one per line
// (errors.Join).
func (sc *securityConfig) tenants(upstreams, mcpServers []string, log *slog.Logger) ([]server.Tenant, error) {
	var out []server.Tenant
	var errs []error
	for i, tc := range sc.Tenants {
		field := fmt.Sprintf("config: tenants[%d] (%s)", i, tc.Name)
		toks, err := readTokens(field, tc.TokensEnv, tc.TokensFile, tc.Tokens)
		if err != nil {
			errs = append(errs, err)
		}
		t := server.Tenant{Name: tc.Name, Admin: tc.Admin, Tokens: toks, Weight: defaultWeight}
		if tc.Weight != nil {
			if w := *tc.Weight; w < 1 || w > server.MaxWeight {
				errs = append(errs, fmt.Errorf("%s.weight: %d must be between 1 and %d", field, w, server.MaxWeight))
			} else {
				t.Weight = w
			}
		}
		switch {
		case tc.Upstreams == nil:
			errs = append(errs, fmt.Errorf(`%s.upstreams: required: name the upstreams it may use, or ["*"] for all`, field))
		case slices.Equal(tc.Upstreams, []string{"*"}):
			if len(mcpServers) > 0 {
				// The gateway's upstreams are its own: no other door serves them.
				t.Upstreams = slices.Clone(upstreams)
			} // else nil: all
		default:
			for j, u := range tc.Upstreams {
				if !slices.Contains(upstreams, u) {
					errs = append(errs, fmt.Errorf("%s.upstreams[%d]: no upstream is named %q", field, j, u))
				}
			}
			t.Upstreams = slices.Clone(tc.Upstreams)
		}
		names := slices.Sorted(maps.Keys(tc.Credentials))
		for _, u := range names {
			if slices.Contains(mcpServers, u) {
				continue // the gateway's (gatewayTenants)
			}
			tcred := tc.Credentials[u]
			var cred *upstream.Credential
			if tcred != nil {
				cred = &tcred.Credential
			}
			cf := fmt.Sprintf("%s.credentials.%s", field, u)
			switch {
			case tcred != nil && tcred.env != nil:
				errs = append(errs, fmt.Errorf("%s: give header and value_env or value_file (an environment is for a stdio server of mcp_servers)", cf))
				continue
			case !slices.Contains(upstreams, u):
				errs = append(errs, fmt.Errorf("%s: no upstream is named %q", cf, u))
				continue
			case t.Upstreams != nil && !slices.Contains(t.Upstreams, u):
				errs = append(errs, fmt.Errorf("%s: the tenant is not granted upstream %q", cf, u))
				continue
			case cred == nil:
				errs = append(errs, fmt.Errorf("%s: empty; give header and value_env or value_file", cf))
				continue
			}
			if err := cred.Load(cf, log.With("component", "credentials")); err != nil {
				errs = append(errs, err)
				continue
			}
			if t.Credentials == nil {
				t.Credentials = map[string]*upstream.Credential{}
			}
			t.Credentials[u] = cred
		}
		out = append(out, t)
	}
	return out, errors.Join(errs...)
}

// serverTLS loads the listener's certificate and, for mutual TLS, the
// client CAs. A bad file at start is an error; later, new handshakes pick
// up files changed on disk (see certReloader).
func (tc *tlsConfig) serverTLS(log *slog.Logger) (*tls.Config, *certReloader, error) {
	if tc.CertFile == "" || tc.KeyFile == "" {
		return nil, nil, fmt.Errorf("config: tls: cert_file and key_file are both required")
	}
	r, err := newCertReloader(*tc, log, time.Now)
	if err != nil {
		return nil, nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.config(), nil },
	}, r, nil
}

// newCertReloader loads tc's files, as of now: a pair that fails to load,
// or whose certificate is expired or not yet valid, is an error, as are
// client CAs that fail to load.
func newCertReloader(tc tlsConfig, log *slog.Logger, now func() time.Time) (*certReloader, error) {
	r := &certReloader{tc: tc, log: log, now: now, checked: now()}
	if _, err := r.reloadPair(); err != nil {
		return nil, fmt.Errorf("config: tls.cert_file, tls.key_file: %w", err)
	}
	if _, err := r.reloadCAs(); err != nil {
		return nil, fmt.Errorf("config: tls.client_ca_file: %w", err)
	}
	r.build()
	return r, nil
}

// certReloader serves the listener's certificate and client CAs from their
// files, re-read when they change on disk (cert-manager or the kubelet swap
// them behind a symlink), so that certificates rotate without a restart. A
// file that fails to load, or a certificate outside its validity, keeps
// the last good one in use.
type certReloader struct {
	tc  tlsConfig
	log *slog.Logger
	now func() time.Time // time.Now but in tests

	mu       sync.Mutex
	checked  time.Time       // when the files were last looked at
	pairStat string          // cert_file's and key_file's stat at the last load, good or bad
	pairFrom time.Time       // when the pair at pairStat, not yet valid at its load, becomes valid; zero: none such
	caStat   string          // client_ca_file's
	cert     tls.Certificate // the last good pair; its Leaf is set
	cas      *x509.CertPool  // the last good client CAs; nil without mutual TLS
	cfg      *tls.Config     // built from cert and cas, for new handshakes
}

// certCheckEvery bounds how often a handshake stats the files. Polling on
// handshakes needs no goroutine to stop and sees a symlink swap, which a
// watch on the files themselves misses; a second's delay is nothing next to
// a rotation's schedule, and a burst of handshakes stats once.
const certCheckEvery = time.Second

// config returns the configuration for a new handshake, first reloading
// whatever changed. Session tickets stay on: crypto/tls re-verifies a
// resumed session's client certificate against the ClientCAs returned here.
func (r *certReloader) config() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.now(); now.Sub(r.checked) >= certCheckEvery {
		r.checked = now
		pair, err := r.reloadPair()
		if err != nil {
			r.log.Warn("tls: cannot reload tls.cert_file, tls.key_file; serving the previous certificate", "err", err)
		}
		cas, err := r.reloadCAs()
		if err != nil {
			r.log.Warn("tls: cannot reload tls.client_ca_file; trusting the previous client CAs", "err", err)
		}
		if pair || cas {
			r.build()
			r.log.Info("tls: reloaded", "certificate", pair, "client_cas", cas, "not_after", r.cert.Leaf.NotAfter.UTC())
		}
	}
	return r.cfg
}

// notAfter returns when the certificate served to new handshakes expires.
func (r *certReloader) notAfter() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert.Leaf.NotAfter
}

// reloadPair loads cert_file and key_file if their stat changed since the
// last try, and reports whether it did. A pair that fails to load, whose
// key does not match, or whose leaf certificate is expired or not yet
// valid is not installed. A failure is reported once per change: the same
// files are not retried, but for a certificate not yet valid, which is
// retried once it is (the issuer's clock may run seconds ahead of ours).
func (r *certReloader) reloadPair() (bool, error) {
	st := fileStat(r.tc.CertFile, r.tc.KeyFile) // before reading: a change while reading is seen next time
	now := r.now()
	if st == r.pairStat && (r.pairFrom.IsZero() || now.Before(r.pairFrom)) {
		return false, nil
	}
	r.pairStat, r.pairFrom = st, time.Time{}
	cert, err := loadPair(r.tc.CertFile, r.tc.KeyFile)
	if err != nil {
		return false, err
	}
	switch leaf := cert.Leaf; {
	case now.After(leaf.NotAfter):
		return false, fmt.Errorf("%s: certificate expired on %s", r.tc.CertFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		r.pairFrom = leaf.NotBefore
		return false, fmt.Errorf("%s: certificate not yet valid until %s", r.tc.CertFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	r.cert = cert
	return true, nil
}

// loadPair reads a PEM certificate chain and its key, with the leaf
// parsed. Its errors name the files: a key that does not match reads
// "…: tls: private key does not match public key".
func loadPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s, %s: %w", certFile, keyFile, err)
	}
	if cert.Leaf == nil { // GODEBUG=x509keypairleaf=0
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return tls.Certificate{}, fmt.Errorf("%s: %w", certFile, err)
		}
	}
	return cert, nil
}

// reloadCAs is reloadPair for client_ca_file.
func (r *certReloader) reloadCAs() (bool, error) {
	if r.tc.ClientCAFile == "" {
		return false, nil
	}
	st := fileStat(r.tc.ClientCAFile)
	if st == r.caStat {
		return false, nil
	}
	r.caStat = st
	pool, err := loadCAs(r.tc.ClientCAFile)
	if err != nil {
		return false, err
	}
	r.cas = pool
	return true, nil
}

func (r *certReloader) build() {
	r.cfg = &tls.Config{
		Certificates: []tls.Certificate{r.cert},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2"},
	}
	if r.cas != nil {
		r.cfg.ClientCAs = r.cas
		r.cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
}

// fileStat sums up the files' modification times and sizes, following
// symlinks, or why they cannot be read.
func fileStat(paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(&b, "%v;", err)
			continue
		}
		fmt.Fprintf(&b, "%d,%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	return b.String()
}

// secureRedis applies TLS and the password from the environment to a
// single Redis's options, parsed from its URL.
func (sc *securityConfig) secureRedis(o *redis.Options) error {
	if sc.RedisTLSCAFile != "" || sc.RedisTLS {
		if o.TLSConfig == nil {
			return fmt.Errorf("config: redis_tls_ca_file, redis_tls: the redis URL must be rediss:// for TLS")
		}
	}
	if err := sc.redisTLSCAs(o.TLSConfig); err != nil {
		return err
	}
	pw, err := sc.redisPassword()
	if err != nil {
		return err
	}
	if pw != "" {
		o.Password = pw
	}
	return nil
}

// secureRedisCluster applies TLS and the password from the environment to
// a Redis Cluster's options.
func (sc *securityConfig) secureRedisCluster(o *redis.ClusterOptions) error {
	if sc.RedisTLS || sc.RedisTLSCAFile != "" {
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if err := sc.redisTLSCAs(o.TLSConfig); err != nil {
			return err
		}
	}
	pw, err := sc.redisPassword()
	if err != nil {
		return err
	}
	o.Password = pw
	return nil
}

func (sc *securityConfig) redisTLSCAs(cfg *tls.Config) error {
	if sc.RedisTLSCAFile == "" || cfg == nil {
		return nil
	}
	pool, err := loadCAs(sc.RedisTLSCAFile)
	if err != nil {
		return fmt.Errorf("config: redis_tls_ca_file: %w", err)
	}
	cfg.RootCAs = pool
	return nil
}

func (sc *securityConfig) redisPassword() (string, error) {
	if sc.RedisPasswordEnv == "" {
		return "", nil
	}
	pw, ok := os.LookupEnv(sc.RedisPasswordEnv)
	if !ok {
		return "", fmt.Errorf("config: redis_password_env: $%s is not set", sc.RedisPasswordEnv)
	}
	return pw, nil
}

// loadCAs reads a PEM file of CA certificates.
func loadCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate found", path)
	}
	return pool, nil
}

// hasTenantCredentials reports whether any tenant binds a credential.
func (sc *securityConfig) hasTenantCredentials() bool {
	for _, tc := range sc.Tenants {
		if len(tc.Credentials) > 0 {
			return true
		}
	}
	return false
}

// scopeKey reads credential_scope_key_env into cfg, and refuses a Redis
// configuration without it once any credential exists: instances with
// different keys would never find each other's copies, and without one
// each draws its own.
func (fc *fileConfig) scopeKey(cfg *coordinator.Config) error {
	if env := fc.CredentialScopeKeyEnv; env != "" {
		v, ok := os.LookupEnv(env)
		switch {
		case !ok || v == "":
			return fmt.Errorf("config: credential_scope_key_env: the environment variable %s is not set", env)
		case len(v) < 16:
			return fmt.Errorf("config: credential_scope_key_env: the value of %s is shorter than 16 bytes", env)
		}
		cfg.CredentialScopeKey = secret.New(v)
	}
	redis := fc.Redis != "" || len(fc.RedisCluster) > 0 || fc.RedisSentinel != nil
	if redis && cfg.CredentialScopeKey.IsZero() && (cfg.NeedsScopeKey() || fc.hasTenantCredentials()) {
		return fmt.Errorf("config: credential_scope_key_env: required with Redis once an upstream or a tenant has a credential (or caller_credentials), so that every instance finds the same cache ids")
	}
	return nil
}
