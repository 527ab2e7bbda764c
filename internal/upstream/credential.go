package upstream

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/coordd/coordd/internal/secret"
)

// Credential is a credential coordd sends upstream: a header and where its
// value comes from, the environment or a file (exactly one). The value is
// the header's whole value ("Bearer ghp_…"). A file is re-read when it
// changes, looked at at most once a second, as the TLS files are; a new
// value that cannot be used (empty, unreadable, a CR or LF inside) is not
// installed, and the last good one stays. The value is never printed: it
// is a secret.Value from the moment it is read.
type Credential struct {
	// Header is the request header the value is sent in. Default:
	// Authorization.
	Header string `yaml:"header"`
	// ValueEnv names the environment variable holding the value.
	ValueEnv string `yaml:"value_env"`
	// ValueFile names the file holding the value (one trailing newline
	// is dropped).
	ValueFile string `yaml:"value_file"`

	src *credentialSource // set by Load
}

// MaxCredentialBytes bounds a credential value, whoever supplies it.
const MaxCredentialBytes = 8 << 10

// Load reads c's value, so that a missing variable or unreadable file
// fails the start. Errors name field (such as "upstreams[0] (github).credential")
// and the variable or file, never the value. log receives the WARN of a
// later reload that fails.
func (c *Credential) Load(field string, log *slog.Logger) error {
	if c.Header == "" {
		c.Header = "Authorization"
	}
	if err := checkCredentialHeader(c.Header); err != nil {
		return fmt.Errorf("%s.header: %v", field, err)
	}
	c.Header = http.CanonicalHeaderKey(c.Header)
	if log == nil {
		log = slog.Default()
	}
	src := &credentialSource{field: field, path: c.ValueFile, log: log}
	switch {
	case (c.ValueEnv == "") == (c.ValueFile == ""):
		return fmt.Errorf("%s: set exactly one of value_env and value_file", field)
	case c.ValueEnv != "":
		v, ok := os.LookupEnv(c.ValueEnv)
		if !ok {
			return fmt.Errorf("%s.value_env: the environment variable %s is not set", field, c.ValueEnv)
		}
		if err := CheckCredential(v); err != nil {
			return fmt.Errorf("%s.value_env: the value of %s %v", field, c.ValueEnv, err)
		}
		src.val.Store(&secretBox{secret.New(v)})
	default:
		v, mod, size, err := readCredentialFile(c.ValueFile)
		if err != nil {
			return fmt.Errorf("%s.value_file: %v", field, err)
		}
		src.val.Store(&secretBox{v})
		src.mod, src.size = mod, size
		src.next.Store(time.Now().Add(time.Second).UnixNano())
	}
	c.src = src
	return nil
}

// FixedCredential returns a loaded Credential whose value is v, sent in
// header: a value a door composes itself (the gateway's environment of a
// stdio server), never re-read.
func FixedCredential(header string, v secret.Value) *Credential {
	src := &credentialSource{field: header}
	src.val.Store(&secretBox{v})
	return &Credential{Header: http.CanonicalHeaderKey(header), src: src}
}

// Value returns c's current value: for a file, as it is on disk (looked at
// at most once a second). The zero Value before Load.
func (c *Credential) Value() secret.Value {
	if c == nil || c.src == nil {
		return secret.Value{}
	}
	return c.src.value()
}

// CheckCredential checks a credential value: not empty, at most
// MaxCredentialBytes, UTF-8, and no control character but tab (no CR or
// LF: a header value cannot hold one, and a value that does is a mistake
// or an attack). Its error never quotes the value.
func CheckCredential(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("is empty")
	case len(v) > MaxCredentialBytes:
		return fmt.Errorf("is over %d bytes", MaxCredentialBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("is not UTF-8")
	case strings.ContainsAny(v, "\r\n"):
		return fmt.Errorf("holds a CR or LF")
	}
	for _, r := range v {
		if r < 0x20 && r != '\t' || r == 0x7f {
			return fmt.Errorf("holds a control character")
		}
	}
	return nil
}

// checkCredentialHeader checks the name of a credential header.
func checkCredentialHeader(name string) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("%q is not a header name", name)
	}
	if reservedHeader(http.CanonicalHeaderKey(name)) && !strings.EqualFold(name, "Authorization") {
		return fmt.Errorf("%q is set by coordd or the connection; it cannot carry a credential", name)
	}
	return nil
}

type secretBox struct{ v secret.Value }

// credentialSource is a Credential's value, re-read from its file when
// that changes.
type credentialSource struct {
	field string
	path  string // "": from the environment, never re-read
	log   *slog.Logger
	val   atomic.Pointer[secretBox]
	next  atomic.Int64 // unix nanoseconds: the file is looked at again after this

	mu       sync.Mutex // protects mod, size, lastWarn: one reader of the file at a time
	mod      time.Time
	size     int64
	lastWarn string
}

func (s *credentialSource) value() secret.Value {
	if s.path != "" {
		if n := s.next.Load(); time.Now().UnixNano() >= n && s.next.CompareAndSwap(n, time.Now().Add(time.Second).UnixNano()) {
			s.reload()
		}
	}
	return s.val.Load().v
}

// reload re-reads the file if its modification time or size changed.
// Hand-rolled like the TLS reloader (cmd/coordd): fsnotify misses the
// kubelet's symlink swap, a stat a second is cheap.
func (s *credentialSource) reload() {
	s.mu.Lock()
	defer s.mu.Unlock()
	fi, err := os.Stat(s.path)
	if err == nil && fi.ModTime().Equal(s.mod) && fi.Size() == s.size {
		return
	}
	v, mod, size, err := readCredentialFile(s.path)
	if err != nil {
		if msg := err.Error(); msg != s.lastWarn {
			s.lastWarn = msg
			s.log.Warn("credential file not reloaded; the last good value stays in use", "field", s.field, "err", err)
		}
		return
	}
	s.lastWarn = ""
	s.mod, s.size = mod, size
	if !v.Equal(s.val.Load().v) {
		s.log.Info("credential reloaded", "field", s.field, "file", s.path)
	}
	s.val.Store(&secretBox{v})
}

func readCredentialFile(path string) (secret.Value, time.Time, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return secret.Value{}, time.Time{}, 0, fmt.Errorf("cannot read %s: %v", path, strippedPathError(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return secret.Value{}, time.Time{}, 0, fmt.Errorf("cannot read %s: %v", path, strippedPathError(err))
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, MaxCredentialBytes+3)); err != nil {
		return secret.Value{}, time.Time{}, 0, fmt.Errorf("cannot read %s: %v", path, strippedPathError(err))
	}
	b := buf.Bytes()
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	v := string(b)
	if err := CheckCredential(v); err != nil {
		return secret.Value{}, time.Time{}, 0, fmt.Errorf("the content of %s %v", path, err)
	}
	return secret.New(v), fi.ModTime(), fi.Size(), nil
}

func strippedPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// reservedHeader reports whether the canonical header name is one coordd
// or the connection sets, which no configuration or caller may: framing,
// hop-by-hop fields, conditional and range requests (coordd revalidates
// its own copies and caches whole bodies), content coding (bodies are
// cached decoded), and credentials other than the configured one.
func reservedHeader(name string) bool {
	switch name {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Proxy-Connection",
		"Te", "Trailer", "Upgrade", "Expect",
		"If-None-Match", "If-Modified-Since", "If-Match", "If-Unmodified-Since", "If-Range", "Range",
		"Accept-Encoding", "Authorization", "Proxy-Authorization", "Cookie", "Cache-Control", "Pragma",
		"Traceparent", "Tracestate", "X-Coordd-Credential":
		return true
	}
	return false
}

// MaxHeaderValueBytes bounds a request header value a caller forwards or
// the configuration sets.
const MaxHeaderValueBytes = 1 << 10

// CheckHeaderValue checks a request header value: UTF-8, at most
// MaxHeaderValueBytes, no control character but tab.
func CheckHeaderValue(v string) error {
	switch {
	case len(v) > MaxHeaderValueBytes:
		return fmt.Errorf("is over %d bytes", MaxHeaderValueBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("is not UTF-8")
	}
	for _, r := range v {
		if (r < 0x20 && r != '\t') || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("holds a control character")
		}
	}
	return nil
}

// prepareHeaders checks and canonicalizes u's request_headers and
// forward_headers.
func prepareHeaders(u *Config, field string) error {
	credHeader := ""
	if u.Credential != nil {
		credHeader = u.CredentialHeader()
	}
	hs := make(http.Header, len(u.RequestHeaders))
	for name, v := range u.RequestHeaders {
		canon := http.CanonicalHeaderKey(name)
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			return fmt.Errorf("%s.request_headers: %q is not a header name", field, name)
		case reservedHeader(canon) || canon == credHeader:
			return fmt.Errorf("%s.request_headers: %s is set by coordd, the connection or the credential", field, canon)
		}
		if err := CheckHeaderValue(v); err != nil {
			return fmt.Errorf("%s.request_headers: the value of %s %v", field, canon, err)
		}
		hs.Set(canon, v)
	}
	u.requestHeaders = hs
	u.forward = make(map[string]bool, len(u.ForwardHeaders))
	for i, name := range u.ForwardHeaders {
		canon := http.CanonicalHeaderKey(name)
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			return fmt.Errorf("%s.forward_headers[%d]: %q is not a header name", field, i, name)
		case reservedHeader(canon) || canon == credHeader:
			return fmt.Errorf("%s.forward_headers[%d]: %s cannot be forwarded: coordd, the connection or the credential sets it", field, i, canon)
		}
		u.ForwardHeaders[i] = canon
		u.forward[canon] = true
	}
	return nil
}

// Forwards reports whether callers' values of the canonical header name
// are sent to u.
func (u *Config) Forwards(name string) bool { return u.forward[name] }

// CredentialHeader is the header a credential for u is sent in: its
// credential's, else Authorization (a caller's or a tenant's credential
// without a header of its own).
func (u *Config) CredentialHeader() string {
	if u.Credential != nil && u.Credential.Header != "" {
		return http.CanonicalHeaderKey(u.Credential.Header)
	}
	return "Authorization"
}
