package faults

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/testpki"
	"github.com/weft-net/weft/subnet/etcd"
	"github.com/weft-net/weft/test/e2e"
)

// TestEtcdClientCertRequired: etcd requires client certificates signed by
// its CA and a node's weftd has none (only the CA to verify etcd). Goal:
// weftd never becomes ready and writes nothing, and the error it logs names
// the endpoint and the missing certificate. The same weftd given the
// certificate becomes ready, so the setup itself works.
func TestEtcdClientCertRequired(t *testing.T) {
	nettest.RequireRoot(t)
	dir := t.TempDir()
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	etcdHost := u.AddHost(t, "etcd", "eth0")
	ca := testpki.NewCA(t, dir, "ca")
	srvCert, srvKey := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth, etcdHost.Addr, netip.MustParseAddr("127.0.0.1"))
	cliCert, cliKey := ca.Issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	srv, err := etcdlocal.StartTLS(filepath.Join(dir, "etcd"), etcdlocal.TLSFiles{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	endpoint := e2e.ServeEtcd(t, etcdHost, srv.Endpoint).Proxy.Endpoint
	admin, err := etcd.NewClient(etcd.ClientConfig{Endpoints: []string{srv.Endpoint}, CAFile: ca.File, CertFile: cliCert, KeyFile: cliKey})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := admin.Put(ctx, e2e.Prefix+"/config", `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`); err != nil {
		t.Fatal(err)
	}
	node := u.AddHost(t, "n1", "eth0")
	weftd := nettest.Binary(t, "weftd")
	args := []string{weftd, "--etcd-endpoints", endpoint, "--etcd-cafile", ca.File,
		"--iface", "eth0", "--health-addr", "127.0.0.1:9470"}

	// Without a client certificate.
	log := filepath.Join(dir, "weftd-nocert.log")
	subnetFile := filepath.Join(dir, "nocert.env")
	stop := startWeftd(t, node, log, append(args, "--subnet-file", subnetFile)...)
	msg := waitLogLine(t, log, "cannot read the network config", 30*time.Second)
	code, _, _ := node.HTTPGet("http://127.0.0.1:9470/readyz")
	stop()
	_, statErr := os.Stat(subnetFile)
	gctx, gcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer gcancel()
	leases, err := admin.Get(gctx, e2e.Prefix+"/subnets/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("weftd without a client certificate logged: %s", msg)
	namesEndpoint, namesCert := strings.Contains(msg, endpoint), strings.Contains(msg, "certificate")
	refused := code != 200 && os.IsNotExist(statErr) && len(leases.Kvs) == 0

	// With it.
	log = filepath.Join(dir, "weftd-cert.log")
	stop = startWeftd(t, node, log, append(args, "--subnet-file", filepath.Join(dir, "cert.env"),
		"--etcd-certfile", cliCert, "--etcd-keyfile", cliKey)...)
	waitLogLine(t, log, "dataplane programmed, ready", 30*time.Second)
	stop()

	record(t, row{"etcd requiring client certificates (TLS, reached over the underlay), weftd with only the CA file",
		"refused (not ready, no subnet file, no lease); its error names the endpoint; says what is missing (the certificate); the same weftd with a certificate ready",
		fmt.Sprintf("%s; %s; %s; yes", yesNo(refused), yesNo(namesEndpoint), yesNo(namesCert)),
		"yes; yes; yes; yes", refused && namesEndpoint && namesCert, ""})
}

// startWeftd runs argv (weftd) in h with its output in log; the returned
// function stops it with SIGTERM and waits.
func startWeftd(t *testing.T, h *nettest.Host, log string, argv ...string) (stop func()) {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := h.Command(context.Background(), argv...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); f.Close() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("weftd did not stop within 10 s of SIGTERM")
		}
	}
	t.Cleanup(stop)
	return stop
}

// waitLogLine waits until log has a line containing msg and returns it.
func waitLogLine(t *testing.T, log, msg string, timeout time.Duration) string {
	t.Helper()
	var line string
	e2e.Eventually(t, timeout, fmt.Sprintf("a line %q in %s", msg, log), func() error {
		b, _ := os.ReadFile(log)
		for l := range strings.Lines(string(b)) {
			if strings.Contains(l, msg) {
				line = strings.TrimSpace(l)
				return nil
			}
		}
		return fmt.Errorf("not yet; log so far:\n%s", b)
	})
	return line
}
