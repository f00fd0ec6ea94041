package etcd

import (
	"context"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/testkit/testpki"
)

// TestNoClientCertificateError: etcd requires client certificates and the
// node has none. The registry's error must say which endpoint refused and
// point at the certificate, not just "deadline exceeded".
func TestNoClientCertificateError(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth, loopback)
	srv, err := etcdlocal.StartTLS(filepath.Join(dir, "etcd"), etcdlocal.TLSFiles{CertFile: cert, KeyFile: key, ClientCAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	c, err := NewClient(ClientConfig{Endpoints: []string{srv.Endpoint}, CAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reg := New(c, Options{RequestTimeout: 2 * time.Second}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = reg.Config(ctx)
	if err == nil {
		t.Fatal("read the config without a client certificate")
	}
	t.Logf("error: %v", err)
	for _, want := range []string{srv.Endpoint, "certificate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
