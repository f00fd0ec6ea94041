package runtimes

import (
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

// podmanConf is the CONTAINERS_CONF of the test hosts: Debian's podman 4.3
// with its CNI backend reading weft's conflist; file locks (no shared
// /dev/shm lock), cgroupfs, and ulimits that root without CAP_SYS_RESOURCE
// may set.
const podmanConf = `[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[network]
network_backend = "cni"
cni_plugin_dirs = [%q, "/usr/lib/cni"]
network_config_dir = %q

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
lock_type = "file"
`

// podmanHost is a weftd node where podman runs containers through the
// conflist of dist/ (unchanged: the subnet file at /run/flannel/subnet.env,
// the address store at /var/lib/cni/networks/weft, host-local's place).
type podmanHost struct{ *rtHost }

func newPodmanHost(t *testing.T, n *e2e.Node, weft string) *podmanHost {
	t.Helper()
	h := &podmanHost{newRTHost(t, n, true, "")}
	netd := filepath.Join(h.Dir, "net.d")
	conf := filepath.Join(h.Dir, "containers.conf")
	if err := os.MkdirAll(netd, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(nettest.ModuleRoot(t), "dist", "10-weft.conflist"), filepath.Join(netd, "10-weft.conflist"))
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(podmanConf, filepath.Dir(weft), netd)), 0o644); err != nil {
		t.Fatal(err)
	}
	h.Env = []string{"CONTAINERS_CONF=" + conf}
	img := filepath.Join(h.Dir, "busybox.tar")
	if err := os.WriteFile(img, busyboxLayer(t), 0o644); err != nil {
		t.Fatal(err)
	}
	h.MustRun("podman", "import", img, "weft-test/busybox:local")
	t.Cleanup(func() { h.Run("podman", "rm", "-a", "-f", "-t", "0") })
	return h
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (h *podmanHost) run(name string) *container {
	h.t.Helper()
	h.MustRun(append([]string{"podman", "run", "-d", "--name", name, "--network", "weft",
		"--cgroup-parent", h.Cgroup, "weft-test/busybox:local"}, serveCmd...)...)
	out := h.MustRun("podman", "inspect", "-f", "{{.NetworkSettings.Networks.weft.IPAddress}}", name)
	ip, err := netip.ParseAddr(strings.TrimSpace(out))
	if err != nil {
		h.t.Fatalf("podman container %s has no address on network weft: %q", name, out)
	}
	return &container{Name: name, IP: ip, Exec: func(argv ...string) (string, error) {
		return h.Run(append([]string{"podman", "exec", name}, argv...)...)
	}}
}

// leftovers lists what a removed container could leave behind on the host:
// host-side veths and address reservations in the plugin's store.
func leftovers(h *rtHost, ipamDir string) string {
	var out []string
	links, _ := h.NS.Handle.LinkList()
	for _, l := range links {
		if l.Type() == "veth" && l.Attrs().Name != h.Link {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	ls, err := h.Run("ls", "-A", ipamDir)
	if err == nil {
		for _, f := range strings.Fields(ls) {
			if f != "lock" && !strings.HasPrefix(f, "last_reserved_ip.") {
				out = append(out, "reservation "+f)
			}
		}
	}
	return strings.Join(out, ", ")
}

func TestPodman(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "podman is not installed (test/setup.sh installs it)")
	}
	c := e2e.NewCluster(t, e2e.Options{Nodes: 2})
	outside := c.Underlay.AddHost(t, "out", "eth0")
	weft := nettest.Binary(t, "weft")
	hosts := []*podmanHost{newPodmanHost(t, c.Nodes[0], weft), newPodmanHost(t, c.Nodes[1], weft)}
	var ctrs []*container
	for i, h := range hosts {
		ct := h.run(fmt.Sprintf("p%d", i+1))
		checkPlacement(t, ct, c.Nodes[i])
		ctrs = append(ctrs, ct)
	}
	t.Run("A to B", func(t *testing.T) { checkPair(t, ctrs[0], ctrs[1]) })
	t.Run("B to A", func(t *testing.T) { checkPair(t, ctrs[1], ctrs[0]) })
	t.Run("outside is masqueraded once", func(t *testing.T) {
		for i := range hosts {
			checkOutside(t, ctrs[i], c.Nodes[i], outside)
		}
	})
	t.Run("rm leaves nothing behind", func(t *testing.T) {
		for i, h := range hosts {
			ipam := "/var/lib/cni/networks/weft"
			if l := leftovers(h.rtHost, ipam); !strings.Contains(l, "reservation "+ctrs[i].IP.String()) || !strings.Contains(l, "link veth") {
				t.Fatalf("before rm, %s holds %q: want %s's veth and address reservation", h.Label, l, ctrs[i].Name)
			}
			h.MustRun("podman", "rm", "-f", "-t", "0", ctrs[i].Name)
			e2e.Eventually(t, 10*time.Second, "cleanup on "+h.Label, func() error {
				if l := leftovers(h.rtHost, ipam); l != "" {
					return fmt.Errorf("left: %s", l)
				}
				return nil
			})
		}
	})
}
