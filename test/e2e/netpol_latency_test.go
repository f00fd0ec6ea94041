package e2e

import (
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestNetworkPolicyLatency measures the time from a NetworkPolicy change
// at the apiserver to the first new connection that sees it, for a pod on
// n1 connecting to a pod on n2: an allowing policy added to a namespace
// whose pods deny all ingress, then removed. Each time is from the request
// to the apiserver to the first connection attempt (every 2 ms, each
// waiting up to 20 ms) that sees the change.
func TestNetworkPolicyLatency(t *testing.T) {
	e := newNPEnv(t)
	from, to := e.pod("np-y", "a"), e.pod("np-x", "b")
	e.apply(t, []*networkingv1.NetworkPolicy{npPolicy("np-x", "deny", nil, ingressOnly)})
	pr := probe{from, to, corev1.ProtocolTCP, 80}
	Eventually(t, 10*time.Second, "denied", func() error { return expect(pr, false) })
	allow := npPolicy("np-x", "allow", nil, ingressOnly, ingress(nil, peerNS(&metav1.LabelSelector{})))
	// a client of its own: the shared one's rate limit (5 requests a
	// second) would be most of what this measures
	cfg := rest.CopyConfig(e.k.Admin)
	cfg.QPS, cfg.Burst = 1000, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nps := client.NetworkingV1().NetworkPolicies("np-x")
	var opened, closed []time.Duration
	for range 20 {
		start := time.Now()
		if _, err := nps.Create(e.ctx, allow, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		opened = append(opened, until(t, pr, true, start))
		start = time.Now()
		if err := nps.Delete(e.ctx, allow.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		closed = append(closed, until(t, pr, false, start))
	}
	p50, p99 := percentiles(opened)
	t.Logf("policy added → new connections allowed: p50 %s, p99 %s (n=%d)", p50, p99, len(opened))
	p50, p99 = percentiles(closed)
	t.Logf("policy removed → new connections refused: p50 %s, p99 %s (n=%d)", p50, p99, len(closed))
}

func expect(pr probe, allowed bool) error {
	if tryWithin(pr, 20*time.Millisecond) != allowed {
		return errors.New("not yet")
	}
	return nil
}

// until polls pr every few milliseconds until it is allowed (or refused)
// and returns the time since start.
func until(t *testing.T, pr probe, allowed bool, start time.Time) time.Duration {
	t.Helper()
	for time.Since(start) < 10*time.Second {
		if expect(pr, allowed) == nil {
			return time.Since(start)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%s: not allowed=%v after 10s", pr, allowed)
	return 0
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond), s[(len(s)*99+99)/100-1].Round(time.Millisecond)
}
