package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/internal/connectivity"
	"github.com/weft-net/weft/internal/lab"
	"github.com/weft-net/weft/subnet"
)

const connectivityUsage = `usage: weftctl connectivity --lab [flags]

Wires a short-lived probe pod on every lab node through the weft CNI plugin
and the node's conflist, as a container runtime does, then measures every
pair: pod to pod and node to node (each node's VTEP address), with loss,
round trip and a TCP exchange. The probes are removed at the end. Exit status
2 when a pair fails.
`

type connFlags struct {
	s       store
	count   int
	timeout time.Duration
	cniBin  string
}

func runConnectivity(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl connectivity", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c connFlags
	c.s.register(fs)
	fs.IntVar(&c.count, "count", 3, "echo requests per pair")
	fs.DurationVar(&c.timeout, "timeout", time.Second, "wait for each reply and TCP exchange")
	fs.StringVar(&c.cniBin, "cni-bin", "", "directory holding the weft plugin (default: next to weftctl, else from PATH)")
	fs.Usage = func() { fmt.Fprint(stderr, connectivityUsage); fs.PrintDefaults() }
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	st, err := c.s.labState()
	if err != nil {
		return err
	}
	if st == nil {
		return errors.New("connectivity: only --lab is supported so far; on etcd or Kubernetes nodes run `weftctl doctor`, which probes every peer over the overlay")
	}
	ls, _, _, err := c.s.leases(ctx, logger(stderr))
	if err != nil {
		return err
	}
	o := lab.Options{CNIBin: c.cniBin, Weftd: "-"}
	if err := o.FindBinaries(selfPath()); err != nil {
		return err
	}
	return c.lab(ctx, st, ls, o.CNIBin, stdout)
}

// lab measures the lab: a probe pod per node, and the nodes themselves.
func (c *connFlags) lab(ctx context.Context, st *lab.State, ls []subnet.Lease, cniBin string, w io.Writer) error {
	var pods, nodes []connectivity.Endpoint
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	for _, ln := range st.Nodes {
		ns, err := lab.OpenNS(ln.NS)
		if err != nil {
			return err
		}
		closers = append(closers, func() error { ns.Handle.Close(); return nil })
		vtep, ok := vtepOf(ls, ln.Addr)
		if !ok {
			return fmt.Errorf("%s: no lease for %s in the lab's etcd", ln.Name, ln.Addr)
		}
		srv, err := connectivity.ListenTCP(ns.Do, netip.AddrPortFrom(vtep, 0))
		if err != nil {
			return fmt.Errorf("%s: %w", ln.Name, err)
		}
		closers = append(closers, srv.Close)
		nodes = append(nodes, connectivity.Endpoint{Name: ln.Name, Addr: vtep, TCPPort: srv.Addr().Port(), Do: ns.Do})
		dir := filepath.Dir(ln.SubnetFile)
		p, err := connectivity.NewProbe(ctx, connectivity.ProbeConfig{
			Name: fmt.Sprintf("weftprobe-%d-%s", os.Getpid(), ln.Name), Conflist: filepath.Join(dir, "10-weft-lab.conflist"),
			CNIPath: []string{cniBin}, CacheDir: filepath.Join(dir, "probe-cache"), NodeDo: ns.Do})
		if err != nil {
			return fmt.Errorf("%s: %w", ln.Name, err)
		}
		closers = append(closers, p.Close)
		pods = append(pods, p.Endpoint(ln.Name+"-probe"))
	}
	o := connectivity.Options{Count: c.count, Timeout: c.timeout}
	bad := 0
	for _, m := range []*connectivity.Matrix{
		connectivity.Measure(ctx, "Pod to pod (a probe pod per node, wired by the weft plugin):", pods, o),
		connectivity.Measure(ctx, "Node to node (VTEP addresses, over the overlay):", nodes, o),
	} {
		if err := m.Render(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
		bad += m.Failures()
	}
	if bad > 0 {
		return errDoctor{2}
	}
	return nil
}

// vtepOf returns the VTEP address (first address of the subnet) of the
// node whose lease has the given public IP.
func vtepOf(ls []subnet.Lease, public netip.Addr) (netip.Addr, bool) {
	for _, l := range ls {
		if l.Attrs.PublicIP == public {
			return backend.Gateway(l.Subnet), true
		}
	}
	return netip.Addr{}, false
}
