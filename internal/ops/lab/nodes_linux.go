package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/weft-net/weft/internal/namespace"
)

// HealthAddr is where every lab weftd serves /readyz and /metrics, on the
// loopback of its own node namespace.
const HealthAddr = "127.0.0.1:9470"

// node is one node namespace with its weftd.
type node struct {
	ns     *namespace.NS
	state  *NodeState
	cmd    *exec.Cmd
	exited chan struct{} // closed when weftd exits
	err    error         // weftd's exit status, set before exited is closed
	pods   []*pod
}

// buildUnderlay creates the switch namespace with its bridge and one node
// namespace per node, each plugged in through eth0 with the next address
// of the underlay and a default route through it.
func (l *Lab) buildUnderlay(context.Context) error {
	sw, err := l.newNS(SwitchName)
	if err != nil {
		return err
	}
	l.State.Switch = sw.Name
	if err := namespace.Bridge(sw, namespace.UnderlayBridge); err != nil {
		return err
	}
	for i := 1; i <= l.opts.Nodes; i++ {
		n, err := l.newNS(NodeName(i))
		if err != nil {
			return err
		}
		dir := filepath.Join(l.opts.StateDir, "nodes", NodeName(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("node dir: %w", err)
		}
		st := NodeState{Name: NodeName(i), NS: n.Name, Addr: l.nodeAddr(i), Backend: l.opts.NodeBackend(i),
			SubnetFile: filepath.Join(dir, "subnet.env"), Log: filepath.Join(dir, "weftd.log")}
		l.State.Nodes = append(l.State.Nodes, st)
		if err := l.plug(sw, n, i, st.Addr); err != nil {
			return err
		}
	}
	return l.save()
}

func (l *Lab) plug(sw, n *namespace.NS, i int, addr netip.Addr) error {
	port := fmt.Sprintf("p%d", i)
	if err := namespace.VethPair(n, "eth0", sw, port); err != nil {
		return err
	}
	if err := namespace.Enslave(sw, port, namespace.UnderlayBridge); err != nil {
		return fmt.Errorf("enslave %s: %w", port, err)
	}
	for _, x := range []struct {
		ns   *namespace.NS
		link string
	}{{n, "eth0"}, {sw, port}} {
		link, err := x.ns.Handle.LinkByName(x.link)
		if err == nil {
			err = x.ns.Handle.LinkSetMTU(link, l.opts.MTU)
		}
		if err != nil {
			return fmt.Errorf("mtu of %s in %s: %w", x.link, x.ns.Name, err)
		}
	}
	if err := namespace.AddAddr(n, "eth0", netip.PrefixFrom(addr, l.opts.Underlay.Bits())); err != nil {
		return err
	}
	// A default route through an address no host owns makes eth0 the
	// default-route interface, as on a real node.
	gw := l.nodeAddr(1<<(32-l.opts.Underlay.Bits()) - 2)
	if out, err := n.Run("ip", "route", "add", "default", "via", gw.String(), "dev", "eth0", "onlink"); err != nil {
		return fmt.Errorf("default route in %s: %w: %s", n.Name, err, out)
	}
	return nil
}

// startNodes starts weftd in every node namespace through `ip netns exec`
// (which also gives it the namespace's own /sys), in its own process group
// so that a Ctrl-C reaches only `lab up`, which stops weftd itself.
func (l *Lab) startNodes(context.Context) error {
	for i := range l.State.Nodes {
		st := &l.State.Nodes[i]
		n := &node{ns: l.ns[st.NS], state: st, exited: make(chan struct{})}
		if err := l.startWeftd(n); err != nil {
			return err
		}
		l.nodes = append(l.nodes, n)
		if err := l.save(); err != nil {
			return err
		}
	}
	return nil
}

func (l *Lab) startWeftd(n *node) error {
	st := n.state
	logf, err := os.OpenFile(st.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("weftd log: %w", err)
	}
	defer logf.Close() // the child has its own descriptor
	argv := []string{"netns", "exec", st.NS, l.opts.Weftd,
		"--etcd-endpoints", l.State.Etcd, "--etcd-prefix", l.opts.EtcdPrefix,
		"--subnet-file", st.SubnetFile, "--iface", "eth0", "--public-ip", st.Addr.String(),
		"--backend", st.Backend, "--health-addr", HealthAddr, "--log-format", "text"}
	cmd := exec.Command("ip", argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = weftdEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start weftd in %s: %w", st.NS, err)
	}
	n.cmd = cmd
	go func() {
		n.err = cmd.Wait()
		close(n.exited)
	}()
	st.Weftd, err = IdentifyProc(cmd.Process.Pid, st.SubnetFile)
	if err != nil {
		return fmt.Errorf("weftd in %s exited at once: %w (see %s)", st.NS, err, st.Log)
	}
	return nil
}

// weftdEnv drops WEFT_* variables: weftd reads them as flag defaults, and
// the lab's flags must be the whole configuration.
func weftdEnv(env []string) []string {
	var out []string
	for _, e := range env {
		if !strings.HasPrefix(e, "WEFT_") {
			out = append(out, e)
		}
	}
	return out
}

// stop sends SIGTERM to weftd and waits, then SIGKILL.
func (n *node) stop() error {
	if n.cmd == nil || n.cmd.Process == nil {
		return nil
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		select {
		case <-n.exited:
			return nil
		default:
		}
		n.cmd.Process.Signal(sig)
		select {
		case <-n.exited:
			return nil
		case <-time.After(5 * time.Second):
		}
	}
	<-n.exited
	return nil
}

// waitReady polls every weftd's /readyz from inside its namespace.
func (l *Lab) waitReady(ctx context.Context) error {
	for _, n := range l.nodes {
		if err := n.waitReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (n *node) waitReady(ctx context.Context) error {
	url := "http://" + HealthAddr + "/readyz"
	var last string
	for {
		code, body, err := Get(ctx, n.ns, url)
		if err == nil && code == 200 {
			return nil
		}
		last = strings.TrimSpace(body)
		if err != nil {
			last = err.Error()
		}
		select {
		case <-n.exited:
			return fmt.Errorf("weftd on %s exited (%v):\n%s", n.state.Name, n.err, tail(n.state.Log, 15))
		case <-ctx.Done():
			return fmt.Errorf("weftd on %s not ready (%s): %w; last log lines:\n%s", n.state.Name, last, ctx.Err(), tail(n.state.Log, 15))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + string(bytes.Join(lines, []byte("\n  ")))
}

var errNotConverged = errors.New("not converged")
