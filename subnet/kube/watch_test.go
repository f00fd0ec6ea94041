package kube_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/subnet"
)

// eventStream reads a Watch's batches one event at a time.
type eventStream struct {
	ch      chan []subnet.Event
	pending []subnet.Event
}

func (s *eventStream) next(t *testing.T, within time.Duration) subnet.Event {
	t.Helper()
	if len(s.pending) == 0 {
		select {
		case b := <-s.ch:
			if len(b) == 0 {
				t.Fatal("Watch sent an empty batch")
			}
			s.pending = b
		case <-time.After(within):
			t.Fatalf("no event within %v", within)
		}
	}
	ev := s.pending[0]
	s.pending = s.pending[1:]
	return ev
}

func (s *eventStream) none(t *testing.T, during time.Duration) {
	t.Helper()
	if len(s.pending) > 0 {
		t.Fatalf("unexpected events %+v", s.pending)
	}
	select {
	case b := <-s.ch:
		t.Fatalf("unexpected events %+v", b)
	case <-time.After(during):
	}
}

func podCIDR(t *testing.T, e *env, node string) netip.Prefix {
	t.Helper()
	return netip.MustParsePrefix(e.node(t, node).Spec.PodCIDR)
}

func testWatch(ctx context.Context, t *testing.T, e *env) {
	r, logs := e.registry(t, "node-a", e.netConf)
	wctx, stop := context.WithCancel(ctx)
	s := &eventStream{ch: make(chan []subnet.Event, 16)}
	werr := make(chan error, 1)
	go func() { werr <- r.Watch(wctx, s.ch) }()
	defer func() {
		stop()
		if err := <-werr; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v after cancel, want context.Canceled", err)
		}
	}()

	// The initial batch: every marked node, in one batch, and not node-x,
	// which has no lease annotations. node-d is dual-stack; this IPv4-only
	// config sees its IPv4 half.
	want := []struct{ node, ip string }{{"node-a", "192.168.77.1"}, {"node-d", "192.168.77.4"}, {"node-o", "10.9.8.7"}}
	first := s.next(t, 30*time.Second)
	batch := append([]subnet.Event{first}, s.pending...)
	s.pending = nil
	if len(batch) != len(want) {
		t.Fatalf("initial batch has %d events, want %d: %+v", len(batch), len(want), batch)
	}
	for i, w := range want {
		ev := batch[i]
		if ev.Type != subnet.EventAdded || ev.Lease.Subnet != podCIDR(t, e, w.node) || ev.Lease.Attrs.PublicIP.String() != w.ip {
			t.Errorf("initial event %d: %v %+v, want added %s (%s, %s)", i, ev.Type, ev.Lease, w.node, podCIDR(t, e, w.node), w.ip)
		}
	}

	// A new peer appears once it publishes its lease.
	e.createNode(t, "node-b", nil, "")
	rb, _ := e.registry(t, "node-b", e.netConf)
	if _, err := rb.Acquire(ctx, vxlanAttrs("192.168.77.2", 0x02), netip.Prefix{}); err != nil {
		t.Fatal(err)
	}
	ev := s.next(t, 5*time.Second)
	bSubnet := podCIDR(t, e, "node-b")
	if ev.Type != subnet.EventAdded || ev.Lease.Subnet != bSubnet || ev.Lease.Attrs.PublicIP.String() != "192.168.77.2" ||
		ev.Lease.Attrs.BackendData == nil || ev.Lease.Attrs.BackendData.VtepMAC.String() != "4e:fb:7d:bf:6b:02" {
		t.Fatalf("new peer: %v %+v", ev.Type, ev.Lease)
	}

	changes := []struct {
		name  string
		ann   map[string]any
		check func(subnet.Lease) bool
	}{
		{"backend data", map[string]any{prefix + "backend-data": `{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:22"}`},
			func(l subnet.Lease) bool { return l.Attrs.BackendData.VtepMAC.String() == "4e:fb:7d:bf:6b:22" }},
		{"public ip", map[string]any{prefix + "public-ip": "192.168.77.22"},
			func(l subnet.Lease) bool { return l.Attrs.PublicIP.String() == "192.168.77.22" }},
		{"backend type", map[string]any{prefix + "backend-type": "host-gw"},
			func(l subnet.Lease) bool { return l.Attrs.BackendType == "host-gw" && l.Attrs.BackendData == nil }},
	}
	for _, c := range changes {
		e.annotate(t, "node-b", c.ann)
		ev := s.next(t, 5*time.Second)
		if ev.Type != subnet.EventAdded || ev.Lease.Subnet != bSubnet || !c.check(ev.Lease) {
			t.Fatalf("change of %s: %v %+v", c.name, ev.Type, ev.Lease)
		}
	}

	// Changes that are not the lease's, nodes without the marker, and
	// annotations that do not parse give no event.
	e.annotate(t, "node-b", map[string]any{"example.com/unrelated": "x"})
	e.createNode(t, "node-c", map[string]string{
		prefix + "backend-type": "vxlan", prefix + "backend-data": `{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:0c"}`, prefix + "public-ip": "192.168.77.12",
	}, "")
	e.annotate(t, "node-b", map[string]any{prefix + "public-ip": "not-an-ip"})
	s.none(t, time.Second)
	if !strings.Contains(logs.String(), "reason=malformed_value") || !strings.Contains(logs.String(), "node/node-b") {
		t.Errorf("no log line for node-b's bad annotation; logs:\n%s", logs)
	}

	// Deleting a node removes its lease within 2 s.
	start := time.Now()
	if err := e.client.CoreV1().Nodes().Delete(ctx, "node-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ev = s.next(t, 2*time.Second)
	if ev.Type != subnet.EventRemoved || ev.Lease.Subnet != bSubnet {
		t.Fatalf("delete: %v %+v, want removed %s", ev.Type, ev.Lease, bSubnet)
	}
	t.Logf("EventRemoved %v after the delete", time.Since(start).Round(time.Millisecond))

	// A node that drops the marker is no longer a peer.
	e.annotate(t, "node-o", map[string]any{prefix + "kube-subnet-manager": nil})
	ev = s.next(t, 5*time.Second)
	if ev.Type != subnet.EventRemoved || ev.Lease.Subnet != podCIDR(t, e, "node-o") {
		t.Fatalf("marker removed: %v %+v", ev.Type, ev.Lease)
	}
}
