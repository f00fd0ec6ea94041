// Package kubetest runs a real Kubernetes control plane for tests: etcd,
// kube-apiserver and, on demand, kube-controller-manager with the
// controllers a test names (node IPAM by default, so that podCIDRs are
// assigned by Kubernetes itself), and finds the kube-proxy built with them
// for tests that run it on their node namespaces. The
// binaries are the ones test/kube/build.sh builds into
// $WEFT_CACHE/kube-<version>/; they run as plain child processes listening on
// 127.0.0.1 only, with their state in a temporary directory, and are stopped
// by PID when the test ends.
//
// This package must not import k8s.io/kubernetes: it only starts binaries and
// talks to them with client-go.
package kubetest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Version is the Kubernetes release the tests run; keep it in step with
// test/kube/build.sh.
const Version = "v1.37.2"

// ClusterCIDR is the cluster CIDR handed to the node IPAM controller; each
// node gets a /NodeMaskSize from it.
const (
	ClusterCIDR  = "10.244.0.0/16"
	NodeMaskSize = 24
)

// BinDir returns the directory holding the control-plane binaries:
// $WEFT_KUBE_BIN if set, else $WEFT_CACHE/kube-<Version> (WEFT_CACHE defaults
// to ~/.cache/weft, as in test/versions.env). It fails, naming the build
// script, when a binary is missing.
func BinDir() (string, error) {
	dir := os.Getenv("WEFT_KUBE_BIN")
	if dir == "" {
		cache := os.Getenv("WEFT_CACHE")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("kubetest: find the cache directory: %w", err)
			}
			cache = filepath.Join(home, ".cache", "weft")
		}
		dir = filepath.Join(cache, "kube-"+Version)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("kubetest: %s %s is missing from %s: run test/kube/build.sh (test/setup.sh does): %w", b, Version, dir, err)
		}
	}
	return dir, nil
}

// KubeProxyBinary returns the path of the kube-proxy that test/kube/build.sh
// builds beside the control plane (same sources, same version), for tests
// that run one per node in the node's network namespace. It fails, naming
// the build script, when it is missing.
func KubeProxyBinary() (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "kube-proxy")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kubetest: kube-proxy %s is missing from %s: run test/kube/build.sh (test/setup.sh does): %w", Version, dir, err)
	}
	return p, nil
}

// Cluster is a running control plane.
type Cluster struct {
	// Admin is a config for the cluster administrator (group system:masters).
	Admin *rest.Config
	// Client is a clientset built from Admin.
	Client kubernetes.Interface
	// Dir holds the state, certificates, keys and logs of the processes.
	Dir string

	owner      testing.TB // the test that started the cluster; its end stops everything
	bin        string
	kubeconfig string
	cm         *process
}

// Start runs etcd and kube-apiserver and waits until the API server is
// ready. Everything is stopped when t ends. It fails t when the binaries
// are missing.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Dir: t.TempDir(), bin: bin, owner: t}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := c.start(ctx, t); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *Cluster) start(ctx context.Context, t testing.TB) error {
	etcdURL, err := c.startEtcd(ctx, t)
	if err != nil {
		return err
	}
	return c.startAPIServer(ctx, t, etcdURL)
}

func (c *Cluster) startEtcd(ctx context.Context, t testing.TB) (string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	p, err := startProcess(t, c.Dir, "etcd", filepath.Join(c.bin, "etcd"),
		"--name=kubetest",
		"--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=kubetest="+peer,
		"--log-level=error",
		"--unsafe-no-fsync",
	)
	if err != nil {
		return "", err
	}
	if err := waitFor(ctx, p, func(ctx context.Context) error { return httpGet(ctx, client+"/health", nil) }); err != nil {
		return "", fmt.Errorf("kubetest: etcd not healthy: %w (log: %s)", err, p.logTail())
	}
	return client, nil
}

// StartControllerManager runs kube-controller-manager with only the node
// IPAM controller, allocating ClusterCIDR in /NodeMaskSize blocks. Call it
// once, from the test that started the cluster or one of its subtests (t
// is only failed on error); it runs until the cluster stops.
func (c *Cluster) StartControllerManager(t testing.TB) {
	t.Helper()
	c.StartControllers(t, "nodeipam")
}

// StartControllers is StartControllerManager with the named controllers
// (for example "nodeipam", "daemonset", "garbagecollector"). No scheduler
// and no kubelet run: a test that needs pods placed and started plays
// their part.
func (c *Cluster) StartControllers(t testing.TB, controllers ...string) {
	t.Helper()
	if c.cm != nil {
		t.Fatal("kubetest: controller-manager already started")
	}
	// A port free a moment ago may be taken before the controller-manager
	// binds it (other tests run beside this one): it then exits at once,
	// and starts again on another port.
	for attempt := 1; ; attempt++ {
		p, err := c.startControllerManager(controllers)
		if err == nil {
			c.cm = p
			return
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
	}
}

// startControllerManager starts kube-controller-manager on a free port
// and waits until it answers on /healthz.
func (c *Cluster) startControllerManager(controllers []string) (*process, error) {
	port, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	p, err := startProcess(c.owner, c.Dir, "kube-controller-manager", filepath.Join(c.bin, "kube-controller-manager"),
		"--kubeconfig="+c.kubeconfig,
		"--authentication-kubeconfig="+c.kubeconfig,
		"--authorization-kubeconfig="+c.kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port[0]),
		"--cert-dir="+filepath.Join(c.Dir, "cm-certs"),
		"--controllers="+strings.Join(controllers, ","),
		"--allocate-node-cidrs=true",
		"--cluster-cidr="+ClusterCIDR,
		"--node-cidr-mask-size="+strconv.Itoa(NodeMaskSize),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--v=1",
	)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	healthz := "https://127.0.0.1:" + strconv.Itoa(port[0]) + "/healthz"
	if err := waitFor(ctx, p, func(ctx context.Context) error {
		return httpGet(ctx, healthz, func(*http.Request) (*http.Client, error) { return insecure, nil })
	}); err != nil {
		p.stop()
		return nil, fmt.Errorf("kubetest: kube-controller-manager not healthy: %w (log: %s)", err, p.logTail())
	}
	return p, nil
}

// ServiceAccountConfig returns a config that authenticates as the
// ServiceAccount namespace/name with a token minted by the TokenRequest API.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	exp := int64(3600)
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}},
		metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubetest: request a token for %s/%s: %w", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(c.Admin)
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

// freePorts returns n TCP ports on 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kubetest: find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitFor polls check until it succeeds, ctx ends or p exits.
func waitFor(ctx context.Context, p *process, check func(context.Context) error) error {
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-p.done:
			return fmt.Errorf("%s exited: %v", p.name, p.err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
