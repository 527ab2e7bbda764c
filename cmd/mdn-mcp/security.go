package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	coordd "github.com/coordd/coordd/clients/go"
)

// coorddSecurity is how mdn-mcp proves itself to coordd: a bearer token,
// and TLS with a private CA and, for mutual TLS, a client certificate.
type coorddSecurity struct {
	token    string // also $COORDD_TOKEN
	tls      bool   // TLS with the system's roots
	caFile   string // implies TLS
	certFile string // client certificate, for mutual TLS; implies TLS
	keyFile  string
}

// options returns the client options for s. Errors name the flag, never
// the token.
func (s coorddSecurity) options() ([]coordd.Option, error) {
	var opts []coordd.Option
	if s.token != "" {
		opts = append(opts, coordd.WithToken(s.token))
	}
	if !s.tls && s.caFile == "" && s.certFile == "" && s.keyFile == "" {
		return opts, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.caFile != "" {
		b, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("--coordd-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--coordd-tls-ca %s: no PEM certificate found", s.caFile)
		}
	}
	if (s.certFile == "") != (s.keyFile == "") {
		return nil, fmt.Errorf("--coordd-tls-cert and --coordd-tls-key go together")
	}
	if s.certFile != "" {
		cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--coordd-tls-cert, --coordd-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return append(opts, coordd.WithTLS(cfg)), nil
}
