package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/ops/flows"
	"github.com/weft-net/weft/internal/ops/lab"
)

const flowsUsage = `usage: weftctl flows [--lab | --kubeconfig file] [--follow] [filters] [--json]

Prints the recent flows of the pods and the network policy verdicts that
weftd keeps on each node (served on /flows of its health address): drops,
with the policies that isolate the pod and the direction, connections the
kernel let through, and closed connections with their byte counts. With
--follow it prints new ones as they come until interrupted.

Without --lab or --kubeconfig it asks this node's weftd (--health-addr).
With --lab it asks every lab node. With --kubeconfig it port-forwards to
the health port of every weftd pod (--weft-namespace, --weft-selector), as
"kubectl port-forward" does, and names pods from the API.
`

type flowsFlags struct {
	s               store
	follow, asJSON  bool
	pod, namespace  string
	verdict, policy string
	port, limit     int
	healthAddr      string
	weftNS, weftSel string
	weftPort        int
}

func runFlows(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl flows", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c flowsFlags
	fs.StringVar(&c.s.kubeconfig, "kubeconfig", env("kubeconfig", ""), "ask every node of this Kubernetes cluster")
	fs.BoolVar(&c.s.lab, "lab", false, "ask every node of the local lab (see \"weftctl lab up\")")
	fs.StringVar(&c.s.stateDir, "state-dir", env("lab-state-dir", lab.DefaultStateDir), "state directory of the lab (with --lab)")
	fs.BoolVar(&c.follow, "follow", false, "print new flows as they come, until interrupted")
	fs.BoolVar(&c.asJSON, "json", false, "one JSON object per flow")
	fs.StringVar(&c.pod, "pod", "", "flows from or to this pod: name (namespace/name with --kubeconfig) or address")
	fs.StringVar(&c.namespace, "namespace", "", "flows with a pod of this namespace, or decided by one of its policies")
	fs.StringVar(&c.verdict, "verdict", "", "dropped or allowed")
	fs.StringVar(&c.policy, "policy", "", "drops decided by this policy: namespace/name or name")
	fs.IntVar(&c.port, "port", 0, "flows from or to this port")
	fs.IntVar(&c.limit, "limit", 100, "at most this many recent flows (0: all the nodes hold)")
	fs.StringVar(&c.healthAddr, "health-addr", env("health-addr", "127.0.0.1:9470"), "weftd's health address on this node (without --lab or --kubeconfig)")
	fs.StringVar(&c.weftNS, "weft-namespace", "kube-weft", "with --kubeconfig: the namespace of weftd's pods")
	fs.StringVar(&c.weftSel, "weft-selector", "k8s-app=weft", "with --kubeconfig: the label selector of weftd's pods")
	fs.IntVar(&c.weftPort, "weft-health-port", 9470, "with --kubeconfig: weftd's health port")
	fs.Usage = func() { fmt.Fprint(stderr, flowsUsage); fs.PrintDefaults() }
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	q, err := c.query()
	if err != nil {
		return err
	}
	eps, names, closeEPs, err := c.endpoints(ctx)
	if err != nil {
		return err
	}
	defer closeEPs()
	if err := c.podFilter(&q, names); err != nil {
		return err
	}
	print := flows.Text
	if c.asJSON {
		print = flows.JSONLine
	}
	if c.follow {
		flows.Follow(ctx, eps, q, names, func(f flow.Flow) { print(stdout, f, names) },
			func(err error) { fmt.Fprintln(stderr, "weftctl flows:", err) })
		return nil
	}
	recent, gaps, errs := flows.Recent(ctx, eps, q, names)
	for _, f := range recent {
		if err := print(stdout, f, names); err != nil {
			return err
		}
	}
	for _, g := range gaps {
		fmt.Fprintln(stderr, "weftctl flows: missing on", g)
	}
	return errors.Join(errs...)
}

func (c *flowsFlags) query() (flows.Query, error) {
	q := flows.Query{Filter: flow.Filter{Verdict: c.verdict, Policy: c.policy}, PodNamespace: c.namespace, Limit: c.limit}
	if c.verdict != "" && c.verdict != flow.Dropped && c.verdict != flow.Allowed {
		return q, fmt.Errorf("--verdict %q: dropped or allowed", c.verdict)
	}
	if c.port < 0 || c.port > 65535 {
		return q, fmt.Errorf("--port %d: not a port", c.port)
	}
	q.Filter.Port = uint16(c.port)
	return q, nil
}

// endpoints are the nodes to ask, the pods' names and what closes them.
func (c *flowsFlags) endpoints(ctx context.Context) ([]flows.Endpoint, flows.Names, func(), error) {
	switch {
	case c.s.lab:
		st, err := c.s.labState()
		if err != nil {
			return nil, nil, nil, err
		}
		return flows.LabEndpoints(st)
	case c.s.kubeconfig != "":
		cfg, err := clientcmd.BuildConfigFromFlags("", c.s.kubeconfig)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("kubeconfig %s: %w", c.s.kubeconfig, err)
		}
		return flows.Kube{Config: cfg, Namespace: c.weftNS, Selector: c.weftSel, Port: c.weftPort}.Endpoints(ctx)
	}
	ep := flows.Endpoint{Node: "local", Client: &http.Client{}, Base: "http://" + c.healthAddr}
	return []flows.Endpoint{ep}, flows.Names{}, func() {}, nil
}

// podFilter turns --pod into the pod's address.
func (c *flowsFlags) podFilter(q *flows.Query, names flows.Names) error {
	if c.pod == "" {
		return nil
	}
	if a, err := netip.ParseAddr(c.pod); err == nil {
		q.Filter.Addrs = []netip.Addr{a}
		return nil
	}
	for a, n := range names {
		if n == c.pod || !strings.Contains(c.pod, "/") && strings.HasSuffix(n, "/"+c.pod) {
			q.Filter.Addrs = append(q.Filter.Addrs, a)
		}
	}
	if len(q.Filter.Addrs) == 0 {
		return fmt.Errorf("--pod %q: no such pod (give its address)", c.pod)
	}
	return nil
}
