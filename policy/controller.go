package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Config says which cluster and which node the controller enforces policy
// for.
type Config struct {
	// Client is the API server's client configuration.
	Client *rest.Config
	// Subnet and IPv6Subnet are this node's pod subnets (either may be
	// invalid, not both): the pods whose address is in one are the ones
	// this node enforces policy for, in that family.
	Subnet, IPv6Subnet netip.Prefix
	// NetNS is the path of the network namespace to program; empty means
	// the one weftd runs in.
	NetNS string
	// Settle is how long the controller waits after a change for more
	// changes before it programs them all (0: 20ms).
	Settle time.Duration
	// Resync is how often the table is written again even without a
	// change, which repairs a table someone removed (0: 1 minute).
	Resync time.Duration
	// Program writes the plans (nil: Program into NetNS).
	Program func(...Plan) error
	// Reporter is told the outcome of every attempt to program the table
	// (nil: nobody).
	Reporter Reporter
	// AddressStore is the CNI plugin's address store (see PortsFromStore),
	// read at each round to check the source addresses of the pods'
	// frames on their bridge ports; empty: no source checks.
	AddressStore string
	// Bridge is the CNI plugin's bridge (empty: DefaultBridge): see
	// Plan.Bridge.
	Bridge string
	// LogGroup is the NFLOG group the drops are logged to, rate-limited
	// (see Plan.LogGroup; 0: not logged).
	LogGroup uint16
	// MaxBackoff bounds the wait between the attempts after a failed
	// transaction, which starts at 100ms and doubles (0: 30s).
	MaxBackoff time.Duration
}

// Reporter is told the outcome of each attempt to program the table: nil
// when the transaction committed, so that the table holds what the
// cluster said when the informers had synced (the first call comes only
// then).
type Reporter interface {
	Programmed(err error)
	// SourceChecks follows each committed transaction: nil when the
	// pods' source addresses are checked (or the address store is
	// turned off), else why they are not (the address store cannot be
	// read, or ErrNoSourceChecks).
	SourceChecks(err error)
}

// Controller keeps the policy table of this node equal to what the
// cluster's NetworkPolicies, Pods and Namespaces say.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	wake   chan struct{}
	srcErr string // the last problem with the source checks, said once
	// noBridge: the pod bridge was missing while the address store listed
	// pods, said once
	noBridge bool
	// noLog: the kernel refused the drop log once, said once
	noLog bool
}

// New validates cfg; nothing is watched or programmed until Run.
func New(cfg Config, log *slog.Logger) (*Controller, error) {
	if cfg.Client == nil {
		return nil, errors.New("network policy: no Kubernetes client")
	}
	if !cfg.Subnet.IsValid() && !cfg.IPv6Subnet.IsValid() {
		return nil, errors.New("network policy: the node has no pod subnet")
	}
	if cfg.Subnet.IsValid() && !cfg.Subnet.Addr().Is4() {
		return nil, fmt.Errorf("network policy: node subnet %s is not IPv4", cfg.Subnet)
	}
	if cfg.IPv6Subnet.IsValid() && !cfg.IPv6Subnet.Addr().Is6() {
		return nil, fmt.Errorf("network policy: node IPv6 subnet %s is not IPv6", cfg.IPv6Subnet)
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 20 * time.Millisecond
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	if cfg.Program == nil {
		ns := cfg.NetNS
		cfg.Program = func(p ...Plan) error { return Program(ns, p...) }
	}
	return &Controller{cfg: cfg, log: log.With("component", "netpol"), wake: make(chan struct{}, 1)}, nil
}

// Run watches the cluster and programs the table until ctx ends; it leaves
// the table in place on return (pods stay isolated while weftd restarts).
func (c *Controller) Run(ctx context.Context) error {
	core, err := restClient(c.cfg.Client, corev1.SchemeGroupVersion, "/api", corev1.AddToScheme)
	if err != nil {
		return err
	}
	netv1, err := restClient(c.cfg.Client, networkingv1.SchemeGroupVersion, "/apis", networkingv1.AddToScheme)
	if err != nil {
		return err
	}
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.poke() },
		UpdateFunc: func(any, any) { c.poke() },
		DeleteFunc: func(any) { c.poke() },
	}
	inform := func(g cache.Getter, resource string, typ runtime.Object, trim cache.TransformFunc) (cache.Store, cache.Controller) {
		return cache.NewInformerWithOptions(cache.InformerOptions{
			ListerWatcher: cache.NewListWatchFromClient(g, resource, metav1.NamespaceAll, fields.Everything()),
			ObjectType:    typ, Handler: poke, Transform: trim,
		})
	}
	podStore, podCtl := inform(core, "pods", &corev1.Pod{}, trimPod)
	nsStore, nsCtl := inform(core, "namespaces", &corev1.Namespace{}, nil)
	npStore, npCtl := inform(netv1, "networkpolicies", &networkingv1.NetworkPolicy{}, nil)
	ictx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, ctl := range []cache.Controller{podCtl, nsCtl, npCtl} {
		wg.Add(1)
		go func() { defer wg.Done(); ctl.RunWithContext(ictx) }()
	}
	defer func() { stop(); wg.Wait() }()
	if !c.waitSynced(ctx, map[string]cache.Controller{"pods": podCtl, "namespaces": nsCtl, "networkpolicies": npCtl}) {
		return nil // ctx ended
	}
	c.log.Info("watching NetworkPolicies, Pods and Namespaces", "subnet", c.cfg.Subnet, "ipv6Subnet", c.cfg.IPv6Subnet)
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	retry := time.NewTimer(0) // the first round
	defer retry.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-retry.C:
		case <-c.wake:
			if sleep(ctx, c.cfg.Settle) != nil {
				return nil
			}
			select { // the changes of the settle time go in this round
			case <-c.wake:
			default:
			}
		}
		err := c.sync(podStore, nsStore, npStore)
		if c.cfg.Reporter != nil {
			c.cfg.Reporter.Programmed(err)
		}
		retry.Stop()
		if err == nil {
			if failures > 0 {
				c.log.Info("programmed network policy after failures", "failures", failures)
			}
			failures = 0
			continue
		}
		wait := min(100*time.Millisecond<<min(failures, 20), c.cfg.MaxBackoff)
		failures++
		c.log.Error("cannot program network policy; the old table stays and weftd is not ready until it commits", "err", err,
			"failures", failures, "retryIn", wait)
		retry.Reset(wait)
	}
}

// waitSynced waits until every informer has listed its objects once,
// saying every 30s which have not; false if ctx ends first.
func (c *Controller) waitSynced(ctx context.Context, ctls map[string]cache.Controller) bool {
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	start := time.Now()
	warned := start
	for {
		var waiting []string
		for name, ctl := range ctls {
			if !ctl.HasSynced() {
				waiting = append(waiting, name)
			}
		}
		if len(waiting) == 0 {
			return true
		}
		if time.Since(warned) >= 30*time.Second {
			warned = time.Now()
			slices.Sort(waiting)
			c.log.Warn("network policy: cannot list from the API server yet; not ready until it can", "waitingFor", waiting,
				"since", time.Since(start).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return false
		case <-poll.C:
		}
	}
}

// restClient is a REST client of one API group version whose scheme knows
// only that group's types (as subnet/kube's Node client: client-go's
// clientset would link every API group into weftd).
func restClient(cfg *rest.Config, gv schema.GroupVersion, apiPath string, add func(*runtime.Scheme) error) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := add(scheme); err != nil {
		return nil, fmt.Errorf("network policy: kubernetes client: %w", err)
	}
	metav1.AddToGroupVersion(scheme, gv)
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = "weftd"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("network policy: kubernetes client: %w", err)
	}
	return rc, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (c *Controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// sync computes the plans from the caches and programs them.
func (c *Controller) sync(pods, nss, nps cache.Store) error {
	start := time.Now()
	var in Input
	for _, o := range pods.List() {
		if p, ok := o.(*corev1.Pod); ok {
			in.Pods = append(in.Pods, p)
		}
	}
	for _, o := range nss.List() {
		if n, ok := o.(*corev1.Namespace); ok {
			in.Namespaces = append(in.Namespaces, n)
		}
	}
	for _, o := range nps.List() {
		if np, ok := o.(*networkingv1.NetworkPolicy); ok {
			in.Policies = append(in.Policies, np)
		}
	}
	var plans []Plan
	for _, local := range []netip.Prefix{c.cfg.Subnet, c.cfg.IPv6Subnet} {
		if !local.IsValid() {
			continue
		}
		in.Local = local
		p := Compute(in)
		p.Bridge = c.cfg.Bridge
		p.LogGroup = c.cfg.LogGroup
		plans = append(plans, p)
	}
	var srcErr error
	if c.cfg.AddressStore != "" {
		ports, err := PortsFromStore(c.cfg.AddressStore)
		srcErr = storeProblem(err, in.Pods, c.cfg.Subnet, c.cfg.IPv6Subnet)
		for i := range plans {
			for _, pp := range ports {
				if pp.Addr.Is4() != plans[i].V6 {
					plans[i].Ports = append(plans[i].Ports, pp)
				}
			}
		}
	}
	for _, err := range plans[0].Errors { // the same in both families: said once
		c.log.Error("network policy not understood: its pods are isolated and none of its rules applied", "err", err)
	}
	err := c.program(plans)
	if errors.Is(err, ErrNoSourceChecks) {
		srcErr, err = err, nil // the inet table committed
	}
	if err != nil {
		return err
	}
	c.sourceChecks(srcErr)
	c.checkBridge(plans)
	var rules, ing, eg int
	for _, p := range plans {
		rules, ing, eg = rules+len(p.Rules), ing+len(p.IngressIsolated), eg+len(p.EgressIsolated)
	}
	c.log.Debug("programmed network policy", "policies", len(in.Policies), "rules", rules,
		"ingressIsolated", ing, "egressIsolated", eg, "took", time.Since(start))
	return nil
}

// program writes plans. When the kernel refuses them with the drop log
// (as one without NFLOG would), it writes them without it: logging never
// stands in the way of enforcement. It says so once.
func (c *Controller) program(plans []Plan) error {
	err := c.cfg.Program(plans...)
	if err == nil || errors.Is(err, ErrNoSourceChecks) || c.cfg.LogGroup == 0 {
		return err
	}
	bare := slices.Clone(plans)
	for i := range bare {
		bare[i].LogGroup = 0
	}
	berr := c.cfg.Program(bare...)
	if berr != nil && !errors.Is(berr, ErrNoSourceChecks) {
		return err
	}
	if !c.noLog {
		c.noLog = true
		c.log.Warn("network policy drops are not logged (no verdicts in flows): the kernel refused the log rules; the policy is enforced", "err", err)
	}
	return berr
}

// sourceChecks tells the reporter whether the pods' source addresses are
// checked, and logs a new problem once, and its end.
func (c *Controller) sourceChecks(err error) {
	if c.cfg.Reporter != nil {
		c.cfg.Reporter.SourceChecks(err)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == c.srcErr {
		return
	}
	if err != nil {
		c.log.Error("network policy is enforced, but not every pod's source addresses are checked on its bridge port", "err", err)
	} else if c.cfg.AddressStore != "" {
		c.log.Info("network policy: checking pods' source addresses on their bridge ports", "store", c.cfg.AddressStore)
	}
	c.srcErr = msg
}

// trimPod keeps of a pod what policy needs: namespace, name, labels, host
// network, container ports, phase, IPs and creation time.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: its object was trimmed already
	}
	t := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels,
			ResourceVersion: p.ResourceVersion, UID: p.UID, CreationTimestamp: p.CreationTimestamp},
		Spec:   corev1.PodSpec{HostNetwork: p.Spec.HostNetwork, NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			t.Spec.Containers = append(t.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return t, nil
}

// checkBridge warns once when the address store lists pods but the pod
// bridge (Config.Bridge) is not there: the plugin's bridge has another
// name, and link-local IPv6 between pods of this node is not dropped.
func (c *Controller) checkBridge(plans []Plan) {
	if c.noBridge || !slices.ContainsFunc(plans, func(p Plan) bool { return len(p.Ports) > 0 }) {
		return
	}
	name := cmp.Or(c.cfg.Bridge, DefaultBridge)
	if _, err := net.InterfaceByName(name); err != nil {
		c.noBridge = true
		c.log.Warn("network policy: the pod bridge is not on this node although the CNI address store lists pods; "+
			"link-local IPv6 between pods is not dropped: set --pod-bridge to the CNI plugin's bridge", "bridge", name, "err", err)
	}
}
