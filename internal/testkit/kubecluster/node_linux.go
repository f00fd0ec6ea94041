package kubecluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/namespace"
)

// containerdConf is a node's containerd 1.6 config: root on disk under the
// node's directory, state and socket on the node's private /run, the CNI
// directories where weft's DaemonSet installs (they are the node's own
// tmpfs mounts), runc with cgroupfs, and what this machine requires (no
// AppArmor; root lacks CAP_SYS_RESOURCE, so no oom_score_adj below
// containerd's own).
const containerdConf = `version = 2
root = %q
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`

// kubeletConf is a node's KubeletConfiguration (JSON is YAML).
func kubeletConf(n *Node, caFile string) map[string]any {
	return map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               n.Cgroup,
		"failSwapOn":               false,
		"podLogsDir":               "/var/log/pods",
		"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
		"address":                  n.IP,
		"healthzBindAddress":       "127.0.0.1",
		"readOnlyPort":             0,
		"clusterDomain":            "cluster.local",
		"clusterDNS":               []string{ClusterDNS},
		"resolvConf":               "/etc/resolv.conf",
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": caFile},
		},
		"authorization": map[string]any{"mode": "Webhook"},
		// The nodes share the machine's disk with everything else on it:
		// kubelet's default thresholds, percentages of that disk (15 % free
		// for images), would taint every node with disk-pressure whenever
		// other work fills it that far, and the cluster would stop
		// scheduling. Absolute thresholds still evict on a really full disk.
		// Image garbage collection, also started by a percentage of that
		// disk (85 % used), is off: it deleted the e2e suite's imported
		// images, which no registry can give back here.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available":   "100Mi",
			"nodefs.available":   "1Gi",
			"nodefs.inodesFree":  "5%",
			"imagefs.available":  "1Gi",
			"imagefs.inodesFree": "5%",
		},
	}
}

// holderScript prepares a node's private mount namespace and then holds
// it (and the UTS namespace) open: its hostname, sysfs of its own network
// namespace with the machine's cgroup hierarchies mounted again, and
// private tmpfs mounts on /run, /var/lib, /var/log, /opt and /etc/cni, so
// that containerd's and kubelet's state, pod logs, the CNI directories and
// pod volumes never meet the machine's or another node's. The standard CNI
// plugins go into /opt/cni/bin (a node's package manager would install
// them; weft's plugin is the DaemonSet's to install).
func holderScript(n *Node, cniBin string) (string, error) {
	cg, err := cgroupMounts()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "set -e\nhostname %s\n", n.Name)
	b.WriteString("umount -l /sys\nmount -t sysfs sysfs /sys\n")
	b.WriteString(cg)
	for _, d := range []string{"/run", "/var/lib", "/var/log", "/opt", "/etc/cni"} {
		fmt.Fprintf(&b, "mount -t tmpfs -o mode=755 tmpfs %s\n", d)
	}
	b.WriteString("mkdir -p /etc/cni/net.d /opt/cni/bin\n")
	for _, p := range []string{"loopback", "portmap", "host-local", "bridge"} {
		fmt.Fprintf(&b, "cp %s /opt/cni/bin/\n", filepath.Join(cniBin, p))
	}
	fmt.Fprintf(&b, "mount --bind %s /etc/machine-id\n", filepath.Join(n.Dir, "machine-id"))
	b.WriteString("exec sleep infinity\n")
	return b.String(), nil
}

// cgroupMounts is the shell that mounts the machine's cgroup file systems
// (the tmpfs on /sys/fs/cgroup and each v1 hierarchy, or the v2 tree) again
// under a fresh /sys.
func cgroupMounts() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("kubecluster: %w", err)
	}
	defer f.Close()
	var b strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent maj:min root mountpoint options ... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		mp, fstype, opts := fields[4], tail[0], tail[2]
		if mp != "/sys/fs/cgroup" && !strings.HasPrefix(mp, "/sys/fs/cgroup/") {
			continue
		}
		if fstype == "cgroup" {
			var keep []string
			for _, o := range strings.Split(opts, ",") {
				switch o {
				case "rw", "ro", "nosuid", "nodev", "noexec", "relatime":
				default:
					keep = append(keep, o)
				}
			}
			opts = strings.Join(keep, ",")
		}
		fmt.Fprintf(&b, "mkdir -p %s && mount -t %s -o %s %s %s\n", mp, fstype, opts, fstype, mp)
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("kubecluster: read mountinfo: %w", err)
	}
	return b.String(), nil
}

// addNode builds node i: its namespaces, cgroup root and holder, then
// containerd with the images imported. Kubelet and kube-proxy start later
// (startKubelet).
func (s *State) addNode(ctx context.Context, cfg *Config, ul *namespace.NS, i int) (*Node, error) {
	n := &Node{Name: nodeName(i), NetNS: s.Prefix + nodeName(i), IP: nodeIP(i).String(),
		Dir: filepath.Join(s.Dir, "nodes", nodeName(i)), Cgroup: "/" + s.Prefix + nodeName(i)}
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	id := make([]byte, 16)
	rand.Read(id)
	if err := os.WriteFile(filepath.Join(n.Dir, "machine-id"), []byte(hex.EncodeToString(id)+"\n"), 0o444); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	nsHandle, err := s.attach(ul, n.NetNS, nodeIP(i))
	if err != nil {
		return nil, err
	}
	nsHandle.Handle.Close()
	s.Cgroups = append(s.Cgroups, n.Cgroup)
	if err := s.save(); err != nil {
		return nil, err
	}
	if err := makeCgroup(n.Cgroup); err != nil {
		return nil, err
	}
	script, err := holderScript(n, cfg.CNIBin)
	if err != nil {
		return nil, err
	}
	holder, err := s.startDaemon(n.Name+"-holder",
		[]string{"nsenter", "--net=" + netnsPath(n.NetNS), "--", "unshare", "-m", "--propagation", "private", "--uts", "--"},
		[]string{"sh", "-c", script}, "")
	if err != nil {
		return nil, err
	}
	n.Holder = holder
	s.Nodes = append(s.Nodes, *n)
	if err := s.save(); err != nil {
		return nil, err
	}
	if err := waitHolder(n); err != nil {
		return nil, fmt.Errorf("%w (log: %s)", err, logTail(s.Dir, n.Name+"-holder"))
	}
	return n, s.startContainerd(ctx, cfg, n)
}

// waitHolder waits until the holder's script has exec'd sleep.
func waitHolder(n *Node) error {
	for end := time.Now().Add(20 * time.Second); ; {
		args, err := cmdline(n.Holder.PID)
		if err != nil && !running(n.Holder.PID) {
			return fmt.Errorf("kubecluster: %s's holder exited: %w", n.Name, err)
		}
		// An empty command line while it runs: the script is in the
		// middle of its exec of sleep.
		if err == nil && args[0] == "sleep" {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("kubecluster: %s's holder did not finish its mounts", n.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// enter returns the command prefix that runs a program in n's namespaces.
func (n *Node) enter() []string {
	return []string{"nsenter", "-t", strconv.Itoa(n.Holder.PID), "-m", "-n", "-u", "--"}
}

// Run runs argv in n's namespaces and returns its combined output.
func (n *Node) Run(ctx context.Context, argv ...string) (string, error) {
	full := append(n.enter(), argv...)
	out, err := exec.CommandContext(ctx, full[0], full[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubecluster: %s on %s: %w: %s", strings.Join(argv, " "), n.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (s *State) startContainerd(ctx context.Context, cfg *Config, n *Node) error {
	conf := filepath.Join(n.Dir, "containerd.toml")
	body := fmt.Sprintf(containerdConf, filepath.Join(n.Dir, "containerd"), cfg.SandboxImage)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	if _, err := s.startDaemon(n.Name+"-containerd", n.enter(), []string{"containerd", "--config", conf}, conf); err != nil {
		return err
	}
	for end := time.Now().Add(60 * time.Second); ; {
		_, err := n.Run(ctx, "ctr", "-a", "/run/containerd/containerd.sock", "version")
		if err == nil {
			break
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return fmt.Errorf("kubecluster: containerd on %s not up: %w (log: %s)", n.Name, err, logTail(s.Dir, n.Name+"-containerd"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, img := range cfg.Images {
		if err := n.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	return nil
}

// ImportImage imports an image archive (OCI layout or docker save) into
// the node's containerd, where the CRI (and so kubelet) finds it.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	_, err := n.Run(ctx, "ctr", "-a", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "import", archive)
	return err
}

// startKubelet writes n's kubelet and kube-proxy configs and starts both.
func (s *State) startKubelet(cfg *Config, p *pki, n *Node) error {
	server := "https://" + net.JoinHostPort(apiserverIP.String(), strconv.Itoa(apiserverPort))
	kc := filepath.Join(n.Dir, "kubelet.kubeconfig")
	if err := p.kubeconfig(kc, server, n.Name+"-kubelet", "system:node:"+n.Name, "system:nodes"); err != nil {
		return err
	}
	conf := filepath.Join(n.Dir, "kubelet.yaml")
	if err := writeJSON(conf, kubeletConf(n, p.CAFile)); err != nil {
		return err
	}
	_, err := s.startDaemon(n.Name+"-kubelet", n.enter(), []string{filepath.Join(cfg.KubeBin, "kubelet"),
		"--config=" + conf, "--kubeconfig=" + kc, "--node-ip=" + n.IP, "--hostname-override=" + n.Name, "--v=1",
	}, conf)
	if err != nil {
		return err
	}
	pkc := filepath.Join(n.Dir, "kube-proxy.kubeconfig")
	if err := p.kubeconfig(pkc, server, n.Name+"-kube-proxy", "system:kube-proxy"); err != nil {
		return err
	}
	_, err = s.startDaemon(n.Name+"-kube-proxy", n.enter(), []string{filepath.Join(cfg.KubeBin, "kube-proxy"),
		"--kubeconfig=" + pkc, "--hostname-override=" + n.Name, "--proxy-mode=" + cfg.ProxyMode,
		"--cluster-cidr=" + ClusterCIDR, "--bind-address=" + n.IP,
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256",
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--v=1",
	}, pkc)
	return err
}
