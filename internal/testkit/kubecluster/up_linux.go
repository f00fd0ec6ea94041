package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Up builds and starts the cluster cfg describes and returns its state;
// the cluster runs until Down(cfg.Dir). Nodes are registered and have
// their podCIDRs when it returns, but are not Ready: no pod network is
// installed (apply weft's manifest). On failure it takes down what it
// built (keeping the daemons' logs at $WEFT_CLUSTER_KEEP_LOGS if set).
func Up(ctx context.Context, cfg Config) (*State, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(stateFile(cfg.Dir)); err == nil {
		return nil, fmt.Errorf("kubecluster: a cluster is up in %s: take it down first", cfg.Dir)
	}
	prefix := NamePrefix(cfg.Name)
	if left, _ := filepath.Glob(netnsPath(prefix + "*")); len(left) > 0 {
		return nil, fmt.Errorf("kubecluster: namespaces of a cluster named %q exist (%v): take it down first", cfg.Name, left)
	}
	if err := checkInotify(cfg.Nodes); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	s := &State{Dir: cfg.Dir, Prefix: prefix}
	if err := s.save(); err != nil {
		return nil, err
	}
	if err := s.up(ctx, &cfg); err != nil {
		if keep := os.Getenv("WEFT_CLUSTER_KEEP_LOGS"); keep != "" {
			os.Rename(filepath.Join(cfg.Dir, "logs"), keep)
		}
		return nil, errors.Join(err, Down(cfg.Dir))
	}
	return s, nil
}

func (c *Config) check() error {
	if len(c.Name) < 1 || len(c.Name) > 5 || strings.Trim(c.Name, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		return fmt.Errorf("kubecluster: cluster name %q: want 1 to 5 lower-case letters or digits", c.Name)
	}
	if c.Dir == "" || !filepath.IsAbs(c.Dir) {
		return fmt.Errorf("kubecluster: the state directory must be an absolute path, not %q", c.Dir)
	}
	if c.Nodes < 1 || c.Nodes > 9 {
		return fmt.Errorf("kubecluster: %d nodes: want 1 to 9", c.Nodes)
	}
	if c.ProxyMode == "" {
		c.ProxyMode = "iptables"
	}
	if c.ProxyMode != "iptables" && c.ProxyMode != "nftables" {
		return fmt.Errorf("kubecluster: kube-proxy mode %q: want iptables or nftables", c.ProxyMode)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(c.KubeBin, b)); err != nil {
			return fmt.Errorf("kubecluster: %s is missing (test/kube/build.sh builds it): %w", b, err)
		}
	}
	if _, err := os.Stat(filepath.Join(c.CNIBin, "loopback")); err != nil {
		return fmt.Errorf("kubecluster: the standard CNI plugins are missing: %w", err)
	}
	return nil
}

func (s *State) up(ctx context.Context, cfg *Config) error {
	p, err := newPKI(filepath.Join(s.Dir, "pki"))
	if err != nil {
		return err
	}
	ul, err := s.buildUnderlay()
	if err != nil {
		return err
	}
	defer ul.Handle.Close()
	cp, err := s.attach(ul, s.CPNetNS(), apiserverIP)
	if err != nil {
		return err
	}
	cp.Handle.Close()
	if err := s.controlPlane(ctx, cfg, p); err != nil {
		return err
	}
	port, err := waitPortFile(filepath.Join(s.Dir, "apiserver.port"), time.Second)
	if err != nil {
		return err
	}
	s.Kubeconfig = filepath.Join(s.Dir, "admin.kubeconfig")
	if err := p.kubeconfig(s.Kubeconfig, "https://127.0.0.1:"+port, "admin", "kubecluster-admin", "system:masters"); err != nil {
		return err
	}
	if err := s.save(); err != nil {
		return err
	}
	var nodes []*Node
	for i := range cfg.Nodes {
		n, err := s.addNode(ctx, cfg, ul, i)
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	if err := s.saveSysctls(); err != nil {
		return err
	}
	for _, n := range nodes {
		if err := s.startKubelet(cfg, p, n); err != nil {
			return err
		}
	}
	return s.routePodCIDRs(ctx)
}

// Client returns a clientset for the admin.
func (s *State) Client() (*kubernetes.Clientset, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	return kubernetes.NewForConfig(rc)
}

// routePodCIDRs waits until every node is registered with a podCIDR and
// routes each in the control plane's namespace.
func (s *State) routePodCIDRs(ctx context.Context) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for _, n := range s.Nodes {
		for {
			node, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err == nil && node.Spec.PodCIDR != "" {
				if err := routePodCIDR(s.CPNetNS(), node.Spec.PodCIDR, n.IP); err != nil {
					return err
				}
				break
			}
			if !s.alive(n.Name + "-kubelet") {
				return fmt.Errorf("kubecluster: kubelet on %s exited: %s", n.Name, logTail(s.Dir, n.Name+"-kubelet"))
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("kubecluster: node %s has no podCIDR (%v): kubelet log: %s", n.Name, err, logTail(s.Dir, n.Name+"-kubelet"))
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}
