package runtimes

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// dockerHost is a weftd node running its own dockerd.
type dockerHost struct {
	*rtHost
	sock string
}

// docker runs the engine's own client (not whatever else is on PATH)
// against this host's dockerd.
func (d *dockerHost) docker(stdin []byte, args ...string) (string, error) {
	cmd := exec.Command("/usr/bin/docker", args...)
	cmd.Env = append(os.Environ(), "DOCKER_HOST=unix://"+d.sock)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	b, err := cmd.CombinedOutput()
	if err != nil {
		return string(b), fmt.Errorf("docker %s on %s: %w: %s", strings.Join(args, " "), d.Label, err, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}

func (d *dockerHost) mustDocker(args ...string) string {
	d.t.Helper()
	out, err := d.docker(nil, args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// startDocker starts dockerd on n configured by `weftctl docker-opts`:
// either as dist/docker.service.d/10-weft.conf does it (its ExecStartPre=
// commands run as they are, with weftctl at /usr/local/bin and the subnet
// file at /run/flannel/subnet.env inside the host's mount namespace, then
// WEFT_DOCKER_OPTS from the file they wrote), or with asJSON from the
// daemon.json document (dockerd --config-file). dockerd keeps its defaults
// otherwise (its iptables rules, docker0), with its own data root, exec root
// and socket, and the test's cgroup parent.
func startDocker(t *testing.T, n *e2e.Node, weftctl string, asJSON bool) *dockerHost {
	t.Helper()
	install := fmt.Sprintf("mount -t tmpfs -o mode=755 tmpfs /usr/local/bin && cp %s /usr/local/bin/weftctl\n", weftctl)
	h := &dockerHost{rtHost: newRTHost(t, n, false, install)}
	h.sock = filepath.Join(h.Dir, "docker.sock")
	argv := []string{"dockerd", "--data-root", filepath.Join(h.Dir, "root"), "--exec-root", filepath.Join(h.Dir, "exec"),
		"--pidfile", filepath.Join(h.Dir, "dockerd.pid"), "-H", "unix://" + h.sock,
		"--cgroup-parent", h.Cgroup, "--exec-opt", "native.cgroupdriver=cgroupfs"}
	if asJSON {
		conf := filepath.Join(h.Dir, "daemon.json")
		args := []string{"docker-opts", "-f", n.SubnetFile, "-d", filepath.Join(h.Dir, "docker_opts.env"), "-daemon-json", conf}
		if out, err := exec.Command(weftctl, args...).CombinedOutput(); err != nil {
			t.Fatalf("weftctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		argv = append(argv, "--config-file", conf)
	} else {
		for _, pre := range unitValues(t, filepath.Join(nettest.ModuleRoot(t), "dist", "docker.service.d", "10-weft.conf"), "ExecStartPre") {
			h.MustRun("sh", "-c", pre)
		}
		env := filepath.Join(h.Dir, "docker_opts.env")
		if err := os.WriteFile(env, []byte(h.MustRun("cat", "/run/docker_opts.env")), 0o644); err != nil {
			t.Fatal(err)
		}
		argv = append(argv, strings.Fields(envValue(t, env, "WEFT_DOCKER_OPTS"))...)
	}
	d := h.StartDaemon("dockerd", argv...)
	h.WaitFor(d, 60*time.Second, "the docker API", func() error {
		_, err := h.docker(nil, "version")
		return err
	})
	if _, err := h.docker(busyboxLayer(t), "import", "-", "weft-test/busybox:local"); err != nil {
		t.Fatal(err)
	}
	return h
}

// unitValues returns the values of key in a systemd unit file, in order.
func unitValues(t *testing.T, path, key string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no %s=", path, key)
	}
	return out
}

// envValue reads one variable of a systemd-style environment file.
func envValue(t *testing.T, path, key string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			if s, err := strconv.Unquote(v); err == nil {
				return s
			}
			return v
		}
	}
	t.Fatalf("%s has no %s:\n%s", path, key, b)
	return ""
}

// run starts a serving busybox container and returns it.
func (d *dockerHost) run(name string) *container {
	d.t.Helper()
	d.mustDocker(append([]string{"run", "-d", "--name", name, "weft-test/busybox:local"}, serveCmd...)...)
	ip, err := netip.ParseAddr(d.mustDocker("inspect", "-f", "{{.NetworkSettings.IPAddress}}", name))
	if err != nil {
		d.t.Fatalf("container %s has no address: %v", name, err)
	}
	return &container{Name: name, IP: ip, Exec: func(argv ...string) (string, error) {
		return d.docker(nil, append([]string{"exec", name}, argv...)...)
	}}
}

func TestDocker(t *testing.T) {
	if _, err := os.Stat("/usr/sbin/dockerd"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "docker.io is not installed (test/setup.sh installs it)")
	}
	c := e2e.NewCluster(t, e2e.Options{Nodes: 2})
	outside := c.Underlay.AddHost(t, "out", "eth0")
	weftctl := nettest.Binary(t, "weftctl")
	hosts := []*dockerHost{startDocker(t, c.Nodes[0], weftctl, false), startDocker(t, c.Nodes[1], weftctl, true)}
	var ctrs []*container
	for i, h := range hosts {
		ct := h.run(fmt.Sprintf("c%d", i+1))
		checkPlacement(t, ct, c.Nodes[i])
		ctrs = append(ctrs, ct)
	}
	t.Run("A to B", func(t *testing.T) { checkPair(t, ctrs[0], ctrs[1]) })
	t.Run("B to A", func(t *testing.T) { checkPair(t, ctrs[1], ctrs[0]) })
	t.Run("FORWARD policy DROP, cluster accepted by weftd's WEFT-FWD", func(t *testing.T) {
		// dockerd made iptables' filter table after weftd started: weftd
		// appends its jump at its next check (every 5 s).
		b := hosts[1]
		e2e.Eventually(t, 10*time.Second, "WEFT-FWD after Docker's rules in FORWARD", func() error {
			out := b.MustRun("iptables", "-S", "FORWARD")
			if !strings.HasSuffix(strings.TrimSpace(out), "-A FORWARD -j WEFT-FWD") || !strings.Contains(out, "-j DOCKER-USER") {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
		b.MustRun("iptables", "-P", "FORWARD", "DROP")
		defer b.MustRun("iptables", "-P", "FORWARD", "ACCEPT")
		checkPair(t, ctrs[0], ctrs[1])
	})
	t.Run("outside is masqueraded once", func(t *testing.T) {
		for i, h := range hosts {
			checkOutside(t, ctrs[i], c.Nodes[i], outside)
			if out := h.MustRun("iptables-save", "-t", "nat"); strings.Contains(out, "MASQUERADE") {
				t.Errorf("dockerd on %s masquerades too (weftd already does):\n%s", h.Label, out)
			}
		}
	})
}
