package main

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
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/natstone/natstone/test/natstest"
)

// certFiles is a certificate and its key, as PEM files, and the certificate parsed.
type certFiles struct {
	cert, key string
	parsed    *x509.Certificate
	private   *ecdsa.PrivateKey
}

// newCert writes a certificate for name signed by parent (self-signed if nil) into dir.
func newCert(t *testing.T, dir, name string, parent *certFiles, ca bool) *certFiles {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		IsCA:         ca, BasicConstraintsValid: true,
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.parsed, parent.private
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := &certFiles{cert: filepath.Join(dir, name+".pem"), key: filepath.Join(dir, name+"-key.pem"), parsed: parsed, private: key}
	if err := os.WriteFile(c.cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestServeWithTLS: natstone serve reaches a server that requires TLS with client certificates,
// given the CA (--nats-ca) and its certificate (--nats-cert, --nats-key); without its certificate
// the server refuses it, and without the CA it refuses the server.
func TestServeWithTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCert(t, dir, "ca", nil, true)
	srvCert, client := newCert(t, dir, "server", ca, false), newCert(t, dir, "natstone", ca, false)
	pair, err := tls.LoadX509KeyPair(srvCert.cert, srvCert.key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.parsed)
	srv := natstest.StartOptions(t, &server.Options{
		TLS: true, TLSVerify: true, TLSTimeout: 5,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
	})
	url := strings.Replace(srv.URL(), "nats://", "tls://", 1)

	for _, tt := range []struct {
		what string
		args []string
		why  *regexp.Regexp // in the log
	}{
		// The server's alert, or its closing the connection, whichever the client reads first.
		{"without a client certificate", []string{"--nats-ca", ca.cert}, regexp.MustCompile(`tls: certificate required|closed by remote after TLS handshake`)},
		{"without the CA", []string{"--nats-cert", client.cert, "--nats-key", client.key}, regexp.MustCompile(`certificate signed by unknown authority`)},
	} {
		p := startProc(t, append([]string{"serve", "--nats-url", url}, tt.args...)...)
		if c := p.wait(t); c != exitError || !tt.why.MatchString(p.log.String()) {
			t.Fatalf("serve %s: exit code %d, want %d with %q:\n%s", tt.what, c, exitError, tt.why, p.log)
		}
	}
	inProcess(t, "--nats-url", url, "--nats-ca", ca.cert, "--nats-cert", client.cert, "--nats-key", client.key)
}
