package kubecluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// controlPlane starts etcd, kube-apiserver, the admin's loopback forwarder,
// kube-controller-manager and kube-scheduler in the control plane's
// namespace, and waits until the API server is ready. It writes the
// kubeconfigs of every component into dir.
func (s *State) controlPlane(ctx context.Context, cfg *Config, p *pki) error {
	dir := filepath.Join(s.Dir, "cp")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	enter := []string{"nsenter", "--net=" + netnsPath(s.CPNetNS()), "--"}
	bin := func(name string) string { return filepath.Join(cfg.KubeBin, name) }
	etcdData := filepath.Join(dir, "etcd")
	_, err := s.startDaemon("etcd", enter, []string{bin("etcd"),
		"--name=weft", "--data-dir=" + etcdData,
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=weft=http://127.0.0.1:2380", "--log-level=warn", "--unsafe-no-fsync",
	}, etcdData)
	if err != nil {
		return err
	}
	apiIP := net.IP(apiserverIP.AsSlice())
	crt, key, err := p.issue("apiserver", "kube-apiserver", nil,
		[]net.IP{apiIP, net.ParseIP("127.0.0.1"), net.ParseIP(kubernetesIP)},
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"})
	if err != nil {
		return err
	}
	kcrt, kkey, err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil)
	if err != nil {
		return err
	}
	sa, err := p.serviceAccountKey()
	if err != nil {
		return err
	}
	_, err = s.startDaemon("kube-apiserver", enter, []string{bin("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0", "--secure-port=" + strconv.Itoa(apiserverPort),
		"--advertise-address=" + apiserverIP.String(),
		"--tls-cert-file=" + crt, "--tls-private-key-file=" + key,
		"--client-ca-file=" + p.CAFile,
		"--kubelet-client-certificate=" + kcrt, "--kubelet-client-key=" + kkey,
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-key-file=" + sa, "--service-account-signing-key-file=" + sa,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--allow-privileged=true", "--profiling=false", "--v=1",
	}, crt)
	if err != nil {
		return err
	}
	if err := s.startForwarder(cfg); err != nil {
		return err
	}
	if err := s.waitAPIServer(ctx, p); err != nil {
		return err
	}
	return s.controllers(cfg, p, dir, enter, sa)
}

// startForwarder starts the admin's loopback forwarder and writes the
// admin kubeconfig that goes through it.
func (s *State) startForwarder(cfg *Config) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("kubecluster: find this program: %w", err)
	}
	// A copy: `go run` deletes its binary when the program exits.
	copyTo := filepath.Join(s.Dir, "bin", "weft-kubecluster-forward")
	if err := copyFile(self, copyTo, 0o755); err != nil {
		return err
	}
	portFile := filepath.Join(s.Dir, "apiserver.port")
	target := net.JoinHostPort(apiserverIP.String(), strconv.Itoa(apiserverPort))
	if _, err := s.startDaemon("forward", []string{"env"}, []string{copyTo, ForwardArg, portFile, netnsPath(s.CPNetNS()), target}, portFile); err != nil {
		return err
	}
	_, err = waitPortFile(portFile, 10*time.Second)
	return err
}

// waitAPIServer waits until /readyz answers 200 through the forwarder.
func (s *State) waitAPIServer(ctx context.Context, p *pki) error {
	port, err := waitPortFile(filepath.Join(s.Dir, "apiserver.port"), time.Second)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(p.CAFile)
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	crt, key, err := p.issue("readyz", "kubecluster-readyz", []string{"system:masters"}, nil, nil)
	if err != nil {
		return err
	}
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
	url := "https://127.0.0.1:" + port + "/readyz"
	var last error
	for ctx.Err() == nil {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /readyz: %s", resp.Status)
		}
		last = err
		if !s.alive("kube-apiserver") {
			return fmt.Errorf("kubecluster: kube-apiserver exited: %s", logTail(s.Dir, "kube-apiserver"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kubecluster: kube-apiserver not ready: %w (%v); log: %s", ctx.Err(), last, logTail(s.Dir, "kube-apiserver"))
}

// controllers writes the kubeconfigs and starts kube-controller-manager
// (allocating node CIDRs) and kube-scheduler.
func (s *State) controllers(cfg *Config, p *pki, dir string, enter []string, sa string) error {
	server := "https://" + net.JoinHostPort(apiserverIP.String(), strconv.Itoa(apiserverPort))
	cmKC := filepath.Join(dir, "controller-manager.kubeconfig")
	schedKC := filepath.Join(dir, "scheduler.kubeconfig")
	if err := p.kubeconfig(cmKC, server, "controller-manager", "system:kube-controller-manager"); err != nil {
		return err
	}
	if err := p.kubeconfig(schedKC, server, "scheduler", "system:kube-scheduler"); err != nil {
		return err
	}
	_, err := s.startDaemon("kube-controller-manager", enter, []string{filepath.Join(cfg.KubeBin, "kube-controller-manager"),
		"--kubeconfig=" + cmKC, "--authentication-kubeconfig=" + cmKC, "--authorization-kubeconfig=" + cmKC,
		"--bind-address=127.0.0.1", "--secure-port=10257",
		"--allocate-node-cidrs=true", "--cluster-cidr=" + ClusterCIDR, "--node-cidr-mask-size=24",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--service-account-private-key-file=" + sa, "--root-ca-file=" + p.CAFile,
		"--cluster-signing-cert-file=" + p.CAFile, "--cluster-signing-key-file=" + p.CAKeyFile,
		"--use-service-account-credentials=true", "--controllers=*,bootstrapsigner,tokencleaner",
		"--leader-elect=false", "--v=1",
	}, cmKC)
	if err != nil {
		return err
	}
	_, err = s.startDaemon("kube-scheduler", enter, []string{filepath.Join(cfg.KubeBin, "kube-scheduler"),
		"--kubeconfig=" + schedKC, "--authentication-kubeconfig=" + schedKC, "--authorization-kubeconfig=" + schedKC,
		"--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false", "--v=1",
	}, schedKC)
	return err
}

// alive reports whether the recorded daemon whose log is name still runs.
func (s *State) alive(name string) bool {
	for _, p := range s.Procs {
		if p.Name == name {
			return p.Alive()
		}
	}
	return false
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	return nil
}
