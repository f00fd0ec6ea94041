package kube

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/weft-net/weft/subnet"
)

// Watch follows every Node with an informer and sends the leases of nodes
// marked kube-subnet-manager=true (this node's own included): first all of
// them in one EventAdded batch, then an EventAdded when a lease's subnets,
// backend type or data or public IPs change and an EventRemoved when the
// node is deleted or stops publishing a lease. Annotations that do not
// parse are logged and the change is skipped. It returns ctx's error when
// ctx ends, after the informer has stopped.
//
// The informer lists and watches Nodes only and keeps of each just what a
// lease is made of (trimNode): at 1,000 nodes that is a few hundred KB
// instead of the many MB that full Node objects (status, images, managed
// fields) take.
func (r *Registry) Watch(ctx context.Context, events chan<- []subnet.Event) error {
	cfg, err := r.Config(ctx)
	if err != nil {
		return err
	}
	w := &watcher{ann: r.ann, cfg: cfg, r: r, leases: map[string]subnet.Lease{}, wake: make(chan struct{}, 1)}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		// A fake clientset says it cannot stream the initial list.
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return r.nodes.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return r.nodes.Watch(ctx, o)
			},
		}, r.nodes),
		ObjectType: &corev1.Node{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    w.onUpdate,
			UpdateFunc: func(_, obj any) { w.onUpdate(obj) },
			DeleteFunc: w.onDelete,
		},
		Transform: r.ann.trimNode,
	})
	ictx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); ctrl.RunWithContext(ictx) }()
	defer func() { stop(); <-done }()
	if !cache.WaitForCacheSync(ctx.Done(), ctrl.HasSynced) {
		return ctx.Err()
	}
	w.markSynced()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.wake:
		}
		batch := w.take()
		if len(batch) == 0 {
			continue
		}
		select {
		case events <- batch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watcher turns informer callbacks into lease events. Callbacks update the
// known leases and queue events; Watch sends the queue as one batch.
type watcher struct {
	ann annotations
	cfg *subnet.Config
	r   *Registry

	mu      sync.Mutex
	leases  map[string]subnet.Lease // node name → published lease
	synced  bool                    // the initial batch is queued
	pending []subnet.Event
	wake    chan struct{}
}

func (w *watcher) onUpdate(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	l, err := w.ann.nodeLease(w.cfg, n)
	switch {
	case errors.Is(err, errNotLease):
		w.r.opts.Rejections.Forget("node/" + n.Name)
		w.forget(n.Name)
	case err != nil:
		w.r.opts.Rejections.Reject("node/"+n.Name, subnet.RejectMalformedValue, err)
	default:
		w.r.opts.Rejections.Forget("node/" + n.Name)
		w.set(n.Name, l)
	}
}

func (w *watcher) onDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if n, ok := obj.(*corev1.Node); ok {
		w.forget(n.Name)
	}
}

func (w *watcher) set(name string, l subnet.Lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old, had := w.leases[name]
	if had && sameLease(old, l) {
		return
	}
	w.leases[name] = l
	if had && old.Key() != l.Key() {
		w.queue(subnet.Event{Type: subnet.EventRemoved, Lease: old})
	}
	w.queue(subnet.Event{Type: subnet.EventAdded, Lease: l})
}

func (w *watcher) forget(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old, had := w.leases[name]
	if !had {
		return
	}
	delete(w.leases, name)
	w.queue(subnet.Event{Type: subnet.EventRemoved, Lease: old})
}

// queue adds ev once the initial batch is out; before, the batch built by
// markSynced covers it. Called with mu held.
func (w *watcher) queue(ev subnet.Event) {
	if !w.synced {
		return
	}
	w.pending = append(w.pending, ev)
	w.signal()
}

func (w *watcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// markSynced queues every known lease, in node-name order, as the initial
// batch.
func (w *watcher) markSynced() {
	w.mu.Lock()
	defer w.mu.Unlock()
	names := make([]string, 0, len(w.leases))
	for name := range w.leases {
		names = append(names, name)
	}
	slices.SortFunc(names, strings.Compare)
	for _, name := range names {
		w.pending = append(w.pending, subnet.Event{Type: subnet.EventAdded, Lease: w.leases[name]})
	}
	w.synced = true
	w.signal()
}

func (w *watcher) take() []subnet.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.pending
	w.pending = nil
	return b
}
