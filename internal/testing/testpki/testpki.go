// Package testpki makes throwaway certificate authorities and certificates
// for tests of TLS and mutual TLS: ECDSA P-256 keys, valid for an hour (or as
// ServerValid says), written as PEM files under t.TempDir().
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority that issues server and client
// certificates. Its methods are safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	dir     string
	serial  atomic.Int64
	CertPEM []byte // the CA's certificate
	// CertFile is a PEM file holding the CA's certificate, for a peer's
	// trust store (client_ca_file, redis_tls_ca_file, --tls-ca-cert-file).
	CertFile string
}

// Pair is an issued certificate and its key, as PEM files and as a
// tls.Certificate.
type Pair struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// NewCA returns a new self-signed CA named name. It calls t.Fatalf on
// failure.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testpki: create CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testpki: parse CA: %v", err)
	}
	ca := &CA{cert: cert, key: key, dir: t.TempDir()}
	ca.serial.Store(1)
	ca.CertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	ca.CertFile = write(t, ca.dir, name+"-ca.pem", ca.CertPEM)
	return ca
}

// Pool returns a cert pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Server issues a server certificate for 127.0.0.1, ::1 and localhost.
func (ca *CA) Server(t testing.TB, name string) Pair {
	t.Helper()
	now := time.Now()
	return ca.issue(t, name, x509.ExtKeyUsageServerAuth, now.Add(-time.Minute), now.Add(time.Hour))
}

// ServerValid is Server with the given validity, for certificates that
// are expired, not yet valid, or that expire at a chosen time.
func (ca *CA) ServerValid(t testing.TB, name string, notBefore, notAfter time.Time) Pair {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageServerAuth, notBefore, notAfter)
}

// Client issues a client certificate whose subject is name.
func (ca *CA) Client(t testing.TB, name string) Pair {
	t.Helper()
	now := time.Now()
	return ca.issue(t, name, x509.ExtKeyUsageClientAuth, now.Add(-time.Minute), now.Add(time.Hour))
}

func (ca *CA) issue(t testing.TB, name string, usage x509.ExtKeyUsage, notBefore, notAfter time.Time) Pair {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testpki: issue %s: %v", name, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testpki: marshal key: %v", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("testpki: key pair: %v", err)
	}
	return Pair{
		CertFile: write(t, ca.dir, name+".pem", certPEM),
		KeyFile:  write(t, ca.dir, name+"-key.pem", keyPEM),
		TLS:      pair,
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testpki: generate key: %v", err)
	}
	return key
}

func write(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatalf("testpki: %v", err)
	}
	return p
}
