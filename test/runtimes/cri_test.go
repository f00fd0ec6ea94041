package runtimes

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// containerdConf is the containerd 1.6 config of a test host: its own root,
// state and socket; CRI with the locally built pause image as the sandbox
// image, weft's conflist from dist/ and the CNI binaries in one directory;
// no AppArmor and no oom_score_adj below containerd's own (root here lacks
// CAP_SYS_RESOURCE).
const containerdConf = `version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "weft.test/pause:local"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
`

type criHost struct {
	*rtHost
	sock   string
	crictl string
}

func newCRIHost(t *testing.T, n *e2e.Node, weft, crictl string, images []string) *criHost {
	t.Helper()
	h := &criHost{rtHost: newRTHost(t, n, true, ""), crictl: crictl}
	h.sock = filepath.Join(h.Dir, "containerd.sock")
	bin, netd := filepath.Join(h.Dir, "cni-bin"), filepath.Join(h.Dir, "net.d")
	for _, d := range []string{bin, netd, filepath.Join(h.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{"weft": weft, "portmap": "/usr/lib/cni/portmap", "loopback": "/usr/lib/cni/loopback"}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, filepath.Join(nettest.ModuleRoot(t), "dist", "10-weft.conflist"), filepath.Join(netd, "10-weft.conflist"))
	crictlConf := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\n", h.sock, h.sock)
	if err := os.WriteFile(filepath.Join(h.Dir, "crictl.yaml"), []byte(crictlConf), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(h.Dir, "config.toml")
	body := fmt.Sprintf(containerdConf, filepath.Join(h.Dir, "root"), filepath.Join(h.Dir, "state"), h.sock, bin, netd)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	d := h.StartDaemon("containerd", "containerd", "--config", conf)
	h.WaitFor(d, 60*time.Second, "the CRI API", func() error {
		_, err := h.cri("info")
		return err
	})
	for _, img := range images {
		h.MustRun("ctr", "-a", h.sock, "-n", "k8s.io", "images", "import", img)
	}
	return h
}

func (h *criHost) cri(args ...string) (string, error) {
	return h.Output(append([]string{h.crictl, "--config", filepath.Join(h.Dir, "crictl.yaml")}, args...)...)
}

func (h *criHost) mustCRI(args ...string) string {
	h.t.Helper()
	out, err := h.cri(args...)
	if err != nil {
		h.t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// pod runs a pod sandbox with one serving busybox container and returns
// the container and the sandbox's ID.
func (h *criHost) pod(name string) (*container, string) {
	h.t.Helper()
	podCfg := writeJSON(h.t, h.Dir, name+"-pod.json", map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "default", "uid": name + "-uid"},
		"log_directory": filepath.Join(h.Dir, "logs", name),
		"linux":         map[string]any{"cgroup_parent": h.Cgroup + "/" + name},
	})
	ctrCfg := writeJSON(h.t, h.Dir, name+"-ctr.json", map[string]any{
		"metadata": map[string]any{"name": "serve"},
		"image":    map[string]any{"image": "weft.test/busybox:local"},
		"command":  serveCmd,
		"log_path": "serve.log",
	})
	podID := h.mustCRI("runp", podCfg)
	ctrID := h.mustCRI("create", podID, ctrCfg, podCfg)
	h.mustCRI("start", ctrID)
	var st struct {
		Status struct {
			Network struct{ IP string } `json:"network"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(h.mustCRI("inspectp", podID)), &st); err != nil {
		h.t.Fatal(err)
	}
	ip, err := netip.ParseAddr(st.Status.Network.IP)
	if err != nil {
		h.t.Fatalf("pod %s has no address: %q", name, st.Status.Network.IP)
	}
	return &container{Name: name, IP: ip, Exec: func(argv ...string) (string, error) {
		return h.cri(append([]string{"exec", ctrID}, argv...)...)
	}}, podID
}

func writeJSON(t *testing.T, dir, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// crictlPath finds crictl where test/setup.sh installs it (the cache
// directory named by CRICTL_VERSION in test/versions.env), or on PATH.
func crictlPath(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("WEFT_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "weft")
	}
	version := ""
	if b, err := os.ReadFile(filepath.Join(nettest.ModuleRoot(t), "test", "versions.env")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "CRICTL_VERSION="); ok {
				version = strings.TrimSpace(v)
			}
		}
	}
	p := filepath.Join(cache, "cri-tools-"+version, "crictl")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if p, err := exec.LookPath("crictl"); err == nil {
		return p
	}
	nettest.CannotRun(t, nettest.SkipTools, "crictl is not installed (test/setup.sh installs it under "+filepath.Dir(p)+")")
	return ""
}

func TestContainerdCRI(t *testing.T) {
	if _, err := exec.LookPath("containerd"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "containerd is not installed (test/setup.sh installs it)")
	}
	crictl := crictlPath(t)
	c := e2e.NewCluster(t, e2e.Options{Nodes: 2})
	weft := nettest.Binary(t, "weft")
	images := []string{
		ociArchive(t, "weft.test/pause:local", pauseLayer(t), []string{"/pause"}),
		ociArchive(t, "weft.test/busybox:local", busyboxLayer(t), nil),
	}
	hosts := []*criHost{newCRIHost(t, c.Nodes[0], weft, crictl, images), newCRIHost(t, c.Nodes[1], weft, crictl, images)}
	var ctrs []*container
	var pods []string
	for i, h := range hosts {
		ct, pod := h.pod(fmt.Sprintf("pod%d", i+1))
		checkPlacement(t, ct, c.Nodes[i])
		ctrs, pods = append(ctrs, ct), append(pods, pod)
	}
	t.Run("A to B", func(t *testing.T) { checkPair(t, ctrs[0], ctrs[1]) })
	t.Run("B to A", func(t *testing.T) { checkPair(t, ctrs[1], ctrs[0]) })
	t.Run("stop and remove leave nothing behind", func(t *testing.T) {
		ipam := "/var/lib/cni/networks/weft"
		for i, h := range hosts {
			if l := leftovers(h.rtHost, ipam); !strings.Contains(l, "reservation "+ctrs[i].IP.String()) || !strings.Contains(l, "link veth") {
				t.Fatalf("before stopp, %s holds %q: want the pod's veth and address reservation", h.Label, l)
			}
			h.mustCRI("stopp", pods[i])
			h.mustCRI("rmp", pods[i])
			e2e.Eventually(t, 10*time.Second, "cleanup on "+h.Label, func() error {
				if l := leftovers(h.rtHost, ipam); l != "" {
					return fmt.Errorf("after stopp and rmp, %s still holds: %s", h.Label, l)
				}
				return nil
			})
			if out := h.mustCRI("pods", "-q"); out != "" {
				t.Errorf("pods left on %s: %s", h.Label, out)
			}
		}
	})
}
