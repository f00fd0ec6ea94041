package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
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
	// Subnet is this node's IPv4 pod subnet: the pods whose address is in
	// it are the ones this node enforces policy for.
	Subnet netip.Prefix
	// NetNS is the path of the network namespace to program; empty means
	// the one weftd runs in.
	NetNS string
	// Settle is how long the controller waits after a change for more
	// changes before it programs them all (0: 20ms).
	Settle time.Duration
	// Resync is how often the table is written again even without a
	// change, which repairs a table someone removed (0: 1 minute).
	Resync time.Duration
	// Program writes a plan (nil: Program into NetNS).
	Program func(Plan) error
}

// Controller keeps the policy table of this node equal to what the
// cluster's NetworkPolicies, Pods and Namespaces say.
type Controller struct {
	cfg   Config
	log   *slog.Logger
	wake  chan struct{}
	ready chan struct{}
	once  sync.Once
}

// New validates cfg; nothing is watched or programmed until Run.
func New(cfg Config, log *slog.Logger) (*Controller, error) {
	if cfg.Client == nil {
		return nil, errors.New("network policy: no Kubernetes client")
	}
	if !cfg.Subnet.IsValid() || !cfg.Subnet.Addr().Is4() {
		return nil, fmt.Errorf("network policy: node subnet %s is not IPv4 (IPv6-only nodes are not enforced yet)", cfg.Subnet)
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 20 * time.Millisecond
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	if cfg.Program == nil {
		ns := cfg.NetNS
		cfg.Program = func(p Plan) error { return Program(ns, p) }
	}
	return &Controller{cfg: cfg, log: log.With("component", "netpol"), wake: make(chan struct{}, 1), ready: make(chan struct{})}, nil
}

// Ready is closed once the table has been programmed from a full view of
// the cluster.
func (c *Controller) Ready() <-chan struct{} { return c.ready }

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
	if !cache.WaitForCacheSync(ctx.Done(), podCtl.HasSynced, nsCtl.HasSynced, npCtl.HasSynced) {
		return nil // ctx ended
	}
	c.log.Info("watching NetworkPolicies, Pods and Namespaces", "subnet", c.cfg.Subnet)
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	c.poke()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-c.wake:
			if sleep(ctx, c.cfg.Settle) != nil {
				return nil
			}
			select { // the changes of the settle time go in this round
			case <-c.wake:
			default:
			}
		}
		c.sync(podStore, nsStore, npStore)
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

// sync computes the plan from the caches and programs it; a failure is
// logged and retried at the next change or resync.
func (c *Controller) sync(pods, nss, nps cache.Store) {
	start := time.Now()
	in := Input{Local: c.cfg.Subnet}
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
	plan := Compute(in)
	for _, err := range plan.Errors {
		c.log.Error("network policy not understood: its pods are isolated and none of its rules applied", "err", err)
	}
	if err := c.cfg.Program(plan); err != nil {
		c.log.Error("cannot program network policy; retrying at the next change", "err", err)
		return
	}
	c.once.Do(func() { close(c.ready) })
	c.log.Debug("programmed network policy", "policies", len(in.Policies), "rules", len(plan.Rules),
		"ingressIsolated", len(plan.IngressIsolated), "egressIsolated", len(plan.EgressIsolated), "took", time.Since(start))
}

// trimPod keeps of a pod what policy needs: namespace, name, labels, host
// network, container ports, phase and IPs.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: its object was trimmed already
	}
	t := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels,
			ResourceVersion: p.ResourceVersion, UID: p.UID},
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
