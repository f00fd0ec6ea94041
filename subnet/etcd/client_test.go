package etcd

import (
	"context"
	"crypto/x509"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/testkit/testpki"
)

// loopback is where the test etcd servers listen: their certificates
// name it.
var loopback = netip.MustParseAddr("127.0.0.1")

func TestNewClientTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	serverCert, serverKey := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth, loopback)
	clientCert, clientKey := ca.Issue(t, dir, "client", x509.ExtKeyUsageClientAuth, loopback)
	otherCA := testpki.NewCA(t, dir, "other-ca")
	srv, err := etcdlocal.StartTLS(filepath.Join(dir, "etcd"), etcdlocal.TLSFiles{CertFile: serverCert, KeyFile: serverKey, ClientCAFile: ca.File})
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
		{"CA and client certificate", ClientConfig{CAFile: ca.File, CertFile: clientCert, KeyFile: clientKey}, true},
		{"no client certificate", ClientConfig{CAFile: ca.File}, false},
		{"server signed by another CA", ClientConfig{CAFile: otherCA.File, CertFile: clientCert, KeyFile: clientKey}, false},
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
	ca := testpki.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "client", x509.ExtKeyUsageClientAuth, loopback)
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
		{"TLS files with an http endpoint", ClientConfig{Endpoints: []string{"http://127.0.0.1:2379"}, CAFile: ca.File}, "plain http but TLS files are given"},
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
