package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/ops/inspect"
)

// ReadyLine is printed by Up once the lab is complete; scripts and tests
// wait for it.
const ReadyLine = "lab is up"

// Up builds the lab, prints its report, and stays in the foreground until
// ctx ends (Ctrl-C, or SIGTERM sent by Down); then it removes everything
// it made. A weftd that exits while the lab is up is reported, not
// restarted.
func Up(ctx context.Context, opts Options) error {
	l, err := Start(ctx, opts)
	if err != nil {
		return err
	}
	out := l.opts.Out
	m, rerr := l.Report(ctx, out)
	if rerr == nil {
		fmt.Fprintf(out, "\n%s: %d nodes, %d pods, state in %s.\n", ReadyLine, len(l.nodes), len(l.State.Pods), l.opts.StateDir)
		fmt.Fprintln(out, "Try: weftctl lab exec node1-pod1 -- ping -c 3 <ip>;  weftctl lab exec node1 -- weftctl peers;  weftctl doctor --lab;  weftctl connectivity --lab;  weftctl lab status;  weftctl lab down (or Ctrl-C).")
		if f := m.Failures(); len(f) > 0 {
			fmt.Fprintf(out, "warning: %d pairs unreachable: %s\n", len(f), strings.Join(f, ", "))
		}
		rerr = l.supervise(ctx)
	}
	fmt.Fprintln(out, "tearing the lab down")
	return errors.Join(rerr, l.Close())
}

// supervise waits for ctx, logging weftd exits.
func (l *Lab) supervise(ctx context.Context) error {
	exited := make(chan *node, len(l.nodes))
	for _, n := range l.nodes {
		go func() {
			select {
			case <-n.exited:
				exited <- n
			case <-ctx.Done():
			}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-exited:
			l.opts.Log.Error("weftd exited", "node", n.state.Name, "err", n.err, "log", n.state.Log)
			fmt.Fprintf(l.opts.Out, "weftd on %s exited (%v); see %s\n", n.state.Name, n.err, n.state.Log)
		}
	}
}

// Status prints what the lab of dir runs: its process, every node's weftd
// and readiness, and the pods.
func Status(ctx context.Context, dir string, w io.Writer) error {
	st, err := LoadState(dir)
	if err != nil {
		return err
	}
	state := "running"
	if !Running(dir) {
		state = "NOT running (debris of a dead lab: `weftctl lab down` removes it)"
	} else if !st.Ready {
		state = "starting"
	}
	fmt.Fprintf(w, "lab %s: pid %d, %s, etcd %s, namespaces %s*\n", dir, st.Proc.PID, state, st.Etcd, st.Prefix)
	for _, n := range st.Nodes {
		fmt.Fprintf(w, "  %-8s %-15s %-7s weftd pid %d %s\n", n.Name, n.Addr, n.Backend, n.Weftd.PID, nodeHealth(ctx, n))
	}
	for _, p := range st.Pods {
		fmt.Fprintf(w, "  %-14s %-15s on %s\n", p.Name, p.IP, p.Node)
	}
	return nil
}

func nodeHealth(ctx context.Context, n NodeState) string {
	if !n.Weftd.Alive() {
		return "(not running)"
	}
	ns, err := OpenNS(n.NS)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer ns.Handle.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	code, body, err := Get(ctx, ns, "http://"+HealthAddr+"/readyz")
	if err != nil {
		return "(readyz: " + err.Error() + ")"
	}
	health := "ready"
	if code != 200 {
		health = "NOT ready: " + strings.TrimSpace(body)
	}
	if code, body, err := Get(ctx, ns, "http://"+HealthAddr+"/metrics"); err == nil && code == 200 {
		m := Metrics(body)
		health += fmt.Sprintf(", metrics: %g leases, %g peers, %g repairs", m["weft_leases"], m["weft_peers"], m["weft_repairs_total"])
	}
	if k, err := inspect.ReadKernel(ns.Handle, ""); err == nil {
		peers := 0
		for _, r := range k.Routes {
			if r.Gw.IsValid() {
				peers++
			}
		}
		health += fmt.Sprintf(", %s with %d peer routes", k.Device.Name, peers)
	}
	return health
}

// Command returns a command that runs argv inside a lab node or pod
// (`ip netns exec`), for `weftctl lab exec`.
func Command(ctx context.Context, dir, name string, argv []string) (*exec.Cmd, error) {
	st, err := LoadState(dir)
	if err != nil {
		return nil, err
	}
	ns, err := st.NamespaceOf(name)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, errors.New("lab exec: no command given")
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "WEFT_LAB_STATE_DIR="+dir, "WEFT_ETCD_ENDPOINTS="+st.Etcd, "WEFT_ETCD_PREFIX="+st.EtcdPfx)
	return cmd, nil
}
