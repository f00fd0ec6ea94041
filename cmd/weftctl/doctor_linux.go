package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/internal/flagenv"
	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/internal/ops/doctor"
	"github.com/weft-net/weft/internal/ops/lab"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/kube"

	"github.com/vishvananda/netlink"
)

type doctorFlags struct {
	s                      store
	subnetFile, cniConfDir string
	healthAddr, device     string
	nodeName, node, output string
	noProbe                bool
	count                  int
	timeout                time.Duration
}

func (d *doctorFlags) register(fs *flag.FlagSet) {
	d.s.register(fs)
	set := &flagenv.Set{FS: fs}
	set.String(&d.subnetFile, "subnet-file", subnet.DefaultSubnetFile, "subnet file weftd writes")
	set.String(&d.cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "directory the container runtime reads its CNI config from")
	set.String(&d.healthAddr, "health-addr", "127.0.0.1:9470", "weftd's health address")
	set.String(&d.nodeName, "node-name", env("node-name", ""), "this node's name (Kubernetes mode; default $NODE_NAME)")
	fs.StringVar(&d.device, "device", "", "overlay device (default: found, as for peers)")
	fs.StringVar(&d.node, "node", "", "with --lab: the lab node to examine (default: every node)")
	fs.StringVar(&d.output, "o", "text", "output: text or json")
	fs.BoolVar(&d.noProbe, "no-probe", false, "skip the active probes to the peers (and firewall/input, which traces the peers' replies to them)")
	fs.IntVar(&d.count, "count", 3, "echo requests per peer")
	fs.DurationVar(&d.timeout, "timeout", time.Second, "wait for each probe reply")
}

const doctorUsage = `usage: weftctl doctor [flags]

Checks this node (or with --lab every lab node) for what breaks an overlay:
weftd and its lease, the subnet file, the CNI config the runtime reads, kernel
settings, the underlay and its MTU, other firewalls and VXLAN devices, and
probes every peer over the overlay. Exit status 0 when all pass, 1 on a
warning, 2 on a failure.
`

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var d doctorFlags
	d.register(fs)
	fs.Usage = func() { fmt.Fprint(stderr, doctorUsage); fs.PrintDefaults() }
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if d.output != "text" && d.output != "json" {
		return fmt.Errorf("-o %q: must be text or json", d.output)
	}
	st, err := d.s.labState()
	if err != nil {
		return err
	}
	ls, cfg, from, err := d.s.leases(ctx, logger(stderr))
	if err != nil {
		return err
	}
	base := doctor.Node{Leases: ls, Config: cfg, Source: from, Device: d.device,
		Probe: doctor.ProbeOptions{Skip: d.noProbe, Count: d.count, Timeout: d.timeout}}
	var reports []*doctor.Report
	if st == nil {
		r, err := d.local(ctx, base)
		if err != nil {
			return err
		}
		reports = append(reports, r)
	} else {
		if reports, err = d.lab(ctx, st, base); err != nil {
			return err
		}
	}
	return d.print(stdout, reports)
}

// local examines the node doctor runs on.
func (d *doctorFlags) local(ctx context.Context, n doctor.Node) (*doctor.Report, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	n.Handle, n.SubnetFile, n.CNIConfDir, n.HealthAddr = h, d.subnetFile, d.cniConfDir, d.healthAddr
	n.Name = "this node"
	if d.s.kubeconfig != "" {
		if d.nodeName == "" {
			return nil, errors.New("--node-name is needed with --kubeconfig: pass this node's name (or set NODE_NAME)")
		}
		c, err := kube.NewClient(d.s.kubeconfig)
		if err != nil {
			return nil, err
		}
		node, err := c.Get(ctx, d.nodeName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", d.nodeName, err)
		}
		n.Name = "node " + d.nodeName
		n.Kube = &doctor.KubeNode{Node: node, AnnotationPrefix: d.s.annot}
	}
	return doctor.Run(ctx, n), nil
}

// lab examines lab nodes, each in its namespace.
func (d *doctorFlags) lab(ctx context.Context, st *lab.State, base doctor.Node) ([]*doctor.Report, error) {
	var out []*doctor.Report
	for _, ln := range st.Nodes {
		if d.node != "" && ln.Name != d.node {
			continue
		}
		ns, err := lab.OpenNS(ln.NS)
		if err != nil {
			return nil, err
		}
		n := base
		n.Name = fmt.Sprintf("%s (%s, %s)", ln.Name, ln.Addr, ln.Backend)
		n.Handle, n.Do = ns.Handle, connectivity.Do(ns.Do)
		n.SubnetFile, n.CNIConfDir, n.HealthAddr = ln.SubnetFile, filepath.Dir(ln.SubnetFile), lab.HealthAddr
		out = append(out, doctor.Run(ctx, n))
		ns.Handle.Close()
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--node %q: no such lab node", d.node)
	}
	return out, nil
}

func (d *doctorFlags) print(w io.Writer, reports []*doctor.Report) error {
	code := 0
	for i, r := range reports {
		code = max(code, r.ExitCode())
		if d.output == "text" {
			if i > 0 {
				fmt.Fprintln(w)
			}
			r.Render(w)
		}
	}
	if d.output == "json" {
		doc := struct {
			Status string           `json:"status"`
			Nodes  []*doctor.Report `json:"nodes"`
		}{doctor.Status(code).String(), reports}
		if err := jsonOut(w, doc); err != nil {
			return err
		}
	}
	if code != 0 {
		return errDoctor{code}
	}
	return nil
}
