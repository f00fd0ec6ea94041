package etcd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/etcdlocal"
)

// certAuthority issues test certificates.
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate, PEM
}

func newCA(t *testing.T, dir, name string) *certAuthority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &certAuthority{cert: cert, key: key, file: filepath.Join(dir, name+".crt")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue writes a certificate and key for name and returns their files.
func (ca *certAuthority) issue(t *testing.T, dir, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
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
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestNewClientTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t, dir, "ca")
	serverCert, serverKey := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	otherCA := newCA(t, dir, "other-ca")
	srv, err := etcdlocal.StartTLS(filepath.Join(dir, "etcd"), etcdlocal.TLSFiles{CertFile: serverCert, KeyFile: serverKey, ClientCAFile: ca.file})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if !strings.HasPrefix(srv.Endpoint, "https://127.0.0.1:") {
		t.Fatalf("endpoint %s", srv.Endpoint)
	}

	tests := []struct {
		name string
		cfg  ClientConfig
		ok   bool
	}{
		{"CA and client certificate", ClientConfig{CAFile: ca.file, CertFile: clientCert, KeyFile: clientKey}, true},
		{"no client certificate", ClientConfig{CAFile: ca.file}, false},
		{"server signed by another CA", ClientConfig{CAFile: otherCA.file, CertFile: clientCert, KeyFile: clientKey}, false},
		{"system roots only", ClientConfig{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Endpoints = []string{srv.Endpoint}
			c, err := NewClient(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			timeout := 500 * time.Millisecond // for a failure
			if tt.ok {
				timeout = 10 * time.Second
			}
			ctx, cancel := context.WithTimeout(t.Context(), timeout)
			defer cancel()
			_, err = c.Put(ctx, "/tls", "yes")
			if tt.ok && err != nil {
				t.Errorf("Put over TLS: %v", err)
			}
			if !tt.ok && err == nil {
				t.Error("Put succeeded, want a TLS failure")
			}
		})
	}
}

func TestNewClientErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t, dir, "ca")
	cert, key := ca.issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	https := []string{"https://127.0.0.1:2379"}
	tests := []struct {
		name string
		cfg  ClientConfig
		want string
	}{
		{"no endpoints", ClientConfig{}, "no endpoints"},
		{"empty endpoint", ClientConfig{Endpoints: []string{"http://a:1", " "}}, "an endpoint is empty"},
		{"no scheme", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}}, "no scheme"},
		{"unknown scheme", ClientConfig{Endpoints: []string{"ftp://127.0.0.1:2379"}}, `scheme "ftp" not supported`},
		{"no host", ClientConfig{Endpoints: []string{"http://"}}, "no host"},
		{"no socket path", ClientConfig{Endpoints: []string{"unix://"}}, "no socket path"},
		{"TLS files with an http endpoint", ClientConfig{Endpoints: []string{"http://127.0.0.1:2379"}, CAFile: ca.file}, "plain http but TLS files are given"},
		{"http and https mixed", ClientConfig{Endpoints: []string{"http://a:1", "https://b:1"}}, "mix plain"},
		{"certificate without key", ClientConfig{Endpoints: https, CertFile: cert}, "given without a key file"},
		{"key without certificate", ClientConfig{Endpoints: https, KeyFile: key}, "given without a certificate file"},
		{"missing CA file", ClientConfig{Endpoints: https, CAFile: filepath.Join(dir, "nope.crt")}, "nope.crt"},
		{"CA file not PEM", ClientConfig{Endpoints: https, CAFile: notPEM}, "no PEM certificate"},
		{"key does not match", ClientConfig{Endpoints: https, CertFile: cert, KeyFile: notPEM}, "client certificate"},
		{"password without user", ClientConfig{Endpoints: https, Password: "secret"}, "no user name"},
		{"negative dial timeout", ClientConfig{Endpoints: https, DialTimeout: -time.Second}, "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClient(tt.cfg)
			if err == nil {
				c.Close()
				t.Fatalf("NewClient succeeded, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestNewClientEndpoints(t *testing.T) {
	t.Parallel()
	// Accepted forms; clientv3 does not connect until the first request.
	for _, eps := range [][]string{
		{"http://127.0.0.1:2379", "http://127.0.0.2:2379"},
		{"https://127.0.0.1:2379"},
		{"unix:///run/etcd.sock"},
		{"unixs:///run/etcd.sock"},
	} {
		t.Run(strings.Join(eps, ","), func(t *testing.T) {
			c, err := NewClient(ClientConfig{Endpoints: eps})
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		})
	}
}

func TestNewClientAuth(t *testing.T) {
	t.Parallel()
	srv, err := etcdlocal.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	root := newTestClient(t, srv.Endpoint)
	ctx := testCtx(t)
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name, user, password string
		ok                   bool
	}{
		{"right password", "root", "rootpw", true},
		{"wrong password", "root", "nope", false},
		{"no credentials", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClient(ClientConfig{Endpoints: []string{srv.Endpoint}, Username: tt.user, Password: tt.password})
			if err == nil {
				defer c.Close()
				_, err = c.Put(ctx, "/auth", "x")
			}
			if (err == nil) != tt.ok {
				t.Errorf("Put: %v, want success %t", err, tt.ok)
			}
		})
	}
}
