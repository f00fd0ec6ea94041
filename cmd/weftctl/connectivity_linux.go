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
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/internal/ops/inspect"

	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/internal/ops/lab"
	"github.com/weft-net/weft/subnet"
)

const connectivityUsage = `usage: weftctl connectivity [--lab] [flags]

Wires a short-lived probe pod through the weft CNI plugin and the node's CNI
config, as a container runtime does, then measures every pair: pod to pod
and node to node (each node's VTEP address), with loss, round trip and a TCP
exchange. The probes are removed at the end. Exit status 2 when a pair fails.

With --lab it does this for every lab node at once. On etcd hosts, run it on
every node at the same time (within --wait): each node publishes its probe
under <etcd-prefix>/connectivity/ (with a short etcd lease), measures the
others, and every node prints the whole matrix.

With --kubeconfig (from anywhere) it creates two probe DaemonSets in
--namespace, one on the pod network and one on the nodes' network (probes on
the VTEP addresses), waits for a probe of each on every node, has each probe
measure the others, collects their results from annotations on their pods,
prints both matrices and deletes the DaemonSets. Apply
kube-manifests/weft-connectivity.yml first (namespace, RBAC).
`

type connFlags struct {
	s                     store
	k                     kubeFlags
	count                 int
	timeout, wait         time.Duration
	cniBin                string
	cniConfDir, cniBinDir string
}

func runConnectivity(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "probe" {
		return runProbe(ctx, args[1:], stderr)
	}
	fs := flag.NewFlagSet("weftctl connectivity", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c connFlags
	c.s.register(fs)
	c.k.register(fs)
	fs.IntVar(&c.count, "count", 3, "echo requests per pair")
	fs.DurationVar(&c.timeout, "timeout", time.Second, "wait for each reply and TCP exchange")
	fs.StringVar(&c.cniBin, "cni-bin", "", "with --lab: directory holding the weft plugin (default: next to weftctl, else from PATH)")
	fs.StringVar(&c.cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "on a host: the runtime's CNI config directory (its first file wires the probe)")
	fs.StringVar(&c.cniBinDir, "cni-bin-dir", "/opt/cni/bin", "on a host: the CNI plugin directories (colon-separated)")
	fs.DurationVar(&c.wait, "wait", 30*time.Second, "on a host: how long to wait for the other nodes to join, and for their results; with --kubeconfig: for the probe pods to be ready, for their results (beyond the measuring), and for their deletion")
	fs.Usage = func() { fmt.Fprint(stderr, connectivityUsage); fs.PrintDefaults() }
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	st, err := c.s.labState()
	if err != nil {
		return err
	}
	if st == nil && c.s.kubeconfig != "" {
		return c.kube(ctx, stdout, stderr)
	}
	ls, _, _, err := c.s.leases(ctx, logger(stderr))
	if err != nil {
		return err
	}
	if st == nil {
		return c.hosts(ctx, ls, stdout)
	}
	o := lab.Options{CNIBin: c.cniBin, Weftd: "-"}
	if err := o.FindBinaries(selfPath()); err != nil {
		return err
	}
	return c.lab(ctx, st, ls, o.CNIBin, stdout)
}

// lab measures the lab: a probe pod per node, and the nodes themselves.
func (c *connFlags) lab(ctx context.Context, st *lab.State, ls []subnet.Lease, cniBin string, w io.Writer) (err error) {
	var pods, nodes []connectivity.Endpoint
	var closers []func() error
	defer func() { // remove the probes; a failure to is reported
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		if cerr := errors.Join(errs...); cerr != nil {
			err = errors.Join(err, fmt.Errorf("remove the probes: %w", cerr))
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
			return kernel.Gateway(l.Subnet), true
		}
	}
	return netip.Addr{}, false
}

// hosts runs on one etcd host: it wires a probe pod here, publishes it
// and this node's VTEP in etcd, waits for the other nodes running
// `weftctl connectivity` at the same time, measures from here to each, and
// prints every node's row once they are published.
func (c *connFlags) hosts(ctx context.Context, ls []subnet.Lease, w io.Writer) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	k, err := inspect.ReadKernel(h, "")
	if err != nil {
		return err
	}
	self, ok := inspect.SelfLease(ls, k)
	if !ok {
		return fmt.Errorf("none of the %d leases belongs to this node (device %s): is weftd running here, on this etcd?", len(ls), k.Device.Name)
	}
	conf, err := firstCNIConf(c.cniConfDir)
	if err != nil {
		return err
	}
	vtep := kernel.Gateway(self.Subnet)
	srv, err := connectivity.ListenTCP(nil, netip.AddrPortFrom(vtep, 0))
	if err != nil {
		return err
	}
	defer srv.Close()
	cache, err := os.MkdirTemp("", "weftctl-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(cache)
	p, err := connectivity.NewProbe(ctx, connectivity.ProbeConfig{Name: fmt.Sprintf("weftprobe-%d", os.Getpid()),
		Conflist: conf, CNIPath: filepath.SplitList(c.cniBinDir), CacheDir: cache})
	if err != nil {
		return err
	}
	defer p.Close()
	me := connectivity.Member{Node: self.Attrs.PublicIP.String(), Pod: p.Addr, PodPort: p.Server.Addr().Port(), VTEP: vtep, VTEPPort: srv.Addr().Port()}
	return c.meet(ctx, me, p.NS.Do, len(ls), w)
}

// meet publishes me, waits for the others, measures and prints.
func (c *connFlags) meet(ctx context.Context, me connectivity.Member, podDo connectivity.Do, nodes int, w io.Writer) error {
	cli, err := c.s.etcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	r := &connectivity.Rendezvous{Client: cli, Prefix: c.s.etcd.Prefix, TTL: 30 * time.Second}
	defer r.Leave(context.WithoutCancel(ctx))
	if err := r.Join(ctx, me); err != nil {
		return err
	}
	fmt.Fprintf(w, "this node %s: probe pod %s; waiting up to %s for the other %d nodes to run weftctl connectivity\n", me.Node, me.Pod, c.wait, nodes-1)
	wctx, cancel := context.WithTimeout(ctx, c.wait)
	members, err := r.WaitMembers(wctx, nodes)
	cancel()
	if err != nil {
		return err
	}
	var pods, vteps []connectivity.Endpoint
	for _, m := range members {
		pods = append(pods, connectivity.Endpoint{Name: m.Node, Addr: m.Pod, TCPPort: m.PodPort})
		vteps = append(vteps, connectivity.Endpoint{Name: m.Node, Addr: m.VTEP, TCPPort: m.VTEPPort})
	}
	o := connectivity.Options{Count: c.count, Timeout: c.timeout}
	podSrc := connectivity.Endpoint{Name: me.Node, Addr: me.Pod, Do: podDo}
	row := connectivity.Row{Node: me.Node,
		Pods:  connectivity.ToJSON(connectivity.MeasureFrom(ctx, podSrc, pods, o)),
		Nodes: connectivity.ToJSON(connectivity.MeasureFrom(ctx, connectivity.Endpoint{Name: me.Node}, vteps, o))}
	if err := r.Publish(ctx, row); err != nil {
		return err
	}
	wctx, cancel = context.WithTimeout(ctx, c.wait)
	rows, err := r.WaitRows(wctx, len(members))
	cancel()
	if err != nil {
		return err
	}
	wctx, cancel = context.WithTimeout(ctx, c.wait)
	err = r.Done(wctx, me.Node, len(members))
	cancel()
	if err != nil {
		return err
	}
	return renderRows(w, rows, len(members), nodes)
}

func renderRows(w io.Writer, rows []connectivity.Row, members, nodes int) error {
	pm := &connectivity.Matrix{Title: "Pod to pod (a probe pod per node, wired by the node's CNI config):"}
	nm := &connectivity.Matrix{Title: "Node to node (VTEP addresses, over the overlay):"}
	for _, r := range rows {
		pm.Pairs = append(pm.Pairs, connectivity.FromJSON(r.Pods)...)
		nm.Pairs = append(nm.Pairs, connectivity.FromJSON(r.Nodes)...)
	}
	fmt.Fprintf(w, "%d of %d nodes took part; %d published their results\n\n", members, nodes, len(rows))
	for _, m := range []*connectivity.Matrix{pm, nm} {
		if err := m.Render(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	if pm.Failures()+nm.Failures() > 0 || members < nodes || len(rows) < members {
		return errDoctor{2}
	}
	return nil
}

// firstCNIConf returns the configuration file the runtime reads: the first
// in lexical order; it must run the weft plugin.
func firstCNIConf(dir string) (string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no CNI configuration in %s (%v): pass --cni-conf-dir", dir, err)
	}
	sort.Strings(files)
	b, err := os.ReadFile(files[0])
	if err != nil {
		return "", err
	}
	if !strings.Contains(string(b), `"weft"`) {
		return "", fmt.Errorf("the runtime reads %s first and it does not run the weft plugin (weftctl doctor says more)", files[0])
	}
	return files[0], nil
}
