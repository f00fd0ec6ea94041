package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/kube"
)

// kubeFleet is many watchers of one Kubernetes cluster, each with the real
// kube registry (its own client and HTTP connection, its own Node informer),
// as that many weftd --kube-subnet-mgr daemons would have.
type kubeFleet struct {
	watchers int
	cur      atomic.Pointer[probe]
}

// createNodes creates Nodes 0..n-1 (kubetest.PeerNode), 16 at a time.
func createNodes(ctx context.Context, tb testing.TB, cs kubernetes.Interface, from, n int) {
	var g errgroup.Group
	g.SetLimit(16)
	for i := from; i < from+n; i++ {
		g.Go(func() error {
			_, err := cs.CoreV1().Nodes().Create(ctx, kubetest.PeerNode(i), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
}

// fastClientset is the admin clientset without client-side rate limits,
// for setting up thousands of objects.
func fastClientset(tb testing.TB, k *kubetest.Cluster) kubernetes.Interface {
	c := rest.CopyConfig(k.Admin)
	c.QPS, c.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		tb.Fatal(err)
	}
	return cs
}

// startKubeFleet starts w watchers and returns when every one has sent its
// first batch (its informer listed every Node). Each is named after Node i,
// as the weftd on that node would be. At most 32 start at once, each
// waiting for its first batch, as a DaemonSet rolls out: a thousand
// informers listing a thousand Nodes at the same moment overload the API
// server and this process on two cores (lists time out and start over).
func startKubeFleet(ctx context.Context, tb testing.TB, k *kubetest.Cluster, w int) *kubeFleet {
	netConf := filepath.Join(tb.TempDir(), "net-conf.json")
	if err := os.WriteFile(netConf, []byte(config), 0o644); err != nil {
		tb.Fatal(err)
	}
	f := &kubeFleet{watchers: w}
	var g errgroup.Group
	g.SetLimit(32)
	for i := range w {
		g.Go(func() error {
			c := rest.CopyConfig(k.Admin)
			// A dialer of its own keeps client-go from sharing one cached
			// transport (one HTTP/2 connection) among all watchers: every
			// weftd has its own connection.
			c.Dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
			nodes, err := kube.NewClientForConfig(c)
			if err != nil {
				return err
			}
			reg, err := kube.New(nodes, kube.Options{NodeName: kubetest.PeerNode(i).Name, ConfigFile: netConf},
				slog.New(slog.DiscardHandler))
			if err != nil {
				return err
			}
			events, first := make(chan []subnet.Event, 16), make(chan struct{})
			go reg.Watch(ctx, events) //nolint:errcheck // ends with ctx
			go f.consume(ctx, i, events, first)
			select {
			case <-first:
				return nil
			case <-time.After(5 * time.Minute):
				return fmt.Errorf("watcher %d: no first batch after 5 minutes", i)
			}
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
	return f
}

// consume reads watcher i's events, closes first on the first batch and
// reports the events of the current probe.
func (f *kubeFleet) consume(ctx context.Context, i int, events <-chan []subnet.Event, first chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case batch := <-events:
			if first != nil {
				close(first)
				first = nil
			}
			if p := f.cur.Load(); p != nil {
				p.saw(i, batch)
			}
		}
	}
}

// saw records watcher i's latency if batch has the probe's event.
func (p *probe) saw(i int, batch []subnet.Event) {
	for _, e := range batch {
		if e.Type == p.typ && e.Lease.Subnet == p.sn && p.lat[i] == 0 {
			p.lat[i] = time.Since(p.t0)
			if p.pending.Add(-1) == 0 {
				close(p.done)
			}
		}
	}
}

// run makes one change with do and waits until every watcher has seen it.
func (f *kubeFleet) run(tb testing.TB, sn netip.Prefix, typ subnet.EventType, do func() error) *probe {
	p := &probe{sn: sn, typ: typ, lat: make([]time.Duration, f.watchers), done: make(chan struct{})}
	p.pending.Store(int32(f.watchers))
	f.cur.Store(p)
	p.t0 = time.Now()
	if err := do(); err != nil {
		tb.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		tb.Fatalf("%v of %s: %d of %d watchers never saw it", typ, sn, p.pending.Load(), f.watchers)
	}
	f.cur.Store(nil)
	return p
}

// addRemove creates Node id (a new node with its lease annotations, as a
// node joining the cluster), waits until every watcher saw its lease, then
// deletes it and waits again.
func (f *kubeFleet) addRemove(ctx context.Context, tb testing.TB, cs kubernetes.Interface, id int) (add, del *probe) {
	n := kubetest.PeerNode(id)
	sn := netip.MustParsePrefix(n.Spec.PodCIDR)
	add = f.run(tb, sn, subnet.EventAdded, func() error {
		_, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		return err
	})
	del = f.run(tb, sn, subnet.EventRemoved, func() error {
		return cs.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
	})
	return add, del
}

// heapInuse is the process's heap in use after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestKubeFleetSmall runs the Kubernetes fleet harness with 10 watchers and
// 20 Nodes against the real kube-apiserver: every watcher sees every added
// and removed Node.
func TestKubeFleetSmall(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := kubetest.Start(t)
	cs := fastClientset(t, k)
	createNodes(ctx, t, cs, 0, 20)
	f := startKubeFleet(ctx, t, k, 10)
	for i := range 2 {
		add, del := f.addRemove(ctx, t, cs, 30000+i)
		for _, p := range []*probe{add, del} {
			for n, d := range p.lat {
				if d <= 0 {
					t.Errorf("%v of %s: watcher %d has no latency recorded", p.typ, p.sn, n)
				}
			}
		}
	}
}

// BenchmarkKubeFleet creates WEFT_FLEET_KUBE_NODES Nodes (1,000) with
// kubelet-sized status in a real kube-apiserver, starts
// WEFT_FLEET_KUBE_WATCHERS watchers (1,000) in this process, then creates
// and deletes WEFT_FLEET_PROBES Nodes one by one and reports how long each
// took to reach every watcher, and the informers' memory.
func BenchmarkKubeFleet(b *testing.B) {
	n, w, probes := envInt("WEFT_FLEET_KUBE_NODES", 1000), envInt("WEFT_FLEET_KUBE_WATCHERS", 1000), envInt("WEFT_FLEET_PROBES", 20)
	for range b.N {
		rep := &report{name: "kube", command: "go test -run '^$' -bench KubeFleet -benchtime 1x -timeout 30m ./bench/fleet", measures: []string{"subnet/kube"}}
		ctx, cancel := context.WithCancel(context.Background())
		k := kubetest.Start(b)
		cs := fastClientset(b, k)
		createNodes(ctx, b, cs, 0, n)
		heap0, t0 := heapInuse(), time.Now()
		f := startKubeFleet(ctx, b, k, w)
		up := time.Since(t0)
		heap1 := heapInuse()
		perWatcher := float64(heap1-heap0) / float64(w)
		rep.printf("kube fleet: %d watchers of %d Nodes up (list + watch + first batch) in %s; load %s\n",
			w, n, up.Round(time.Millisecond), benchreport.LoadAvg("/"))
		rep.printf("kube fleet memory: heap %.0fMB for %d watchers: %.0fKB per watcher, %.0f bytes per Node per watcher (informer cache, registry, client)\n",
			float64(heap1-heap0)/(1<<20), w, perWatcher/1024, perWatcher/float64(n))
		var adds, dels, worstAdd, worstDel []time.Duration
		for i := range probes {
			add, del := f.addRemove(ctx, b, cs, 40000+i)
			adds, dels = append(adds, add.lat...), append(dels, del.lat...)
			worstAdd, worstDel = append(worstAdd, slices.Max(add.lat)), append(worstDel, slices.Max(del.lat))
		}
		rep.printf("new Node -> every watcher (%d x %d): %s; slowest watcher per Node: %s\n", probes, w, quantiles(adds), quantiles(worstAdd))
		rep.printf("deleted Node -> every watcher (%d x %d): %s; slowest watcher per Node: %s; load %s\n",
			probes, w, quantiles(dels), quantiles(worstDel), benchreport.LoadAvg("/"))
		rep.verdicts(adds)
		b.ReportMetric(float64(quantile(adds, 0.5).Microseconds())/1000, "add-p50-ms")
		b.ReportMetric(float64(quantile(adds, 0.99).Microseconds())/1000, "add-p99-ms")
		b.ReportMetric(perWatcher/float64(n), "B/node/watcher")
		rep.write(b)
		cancel()
	}
}
