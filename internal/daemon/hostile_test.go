package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
	"github.com/weft-net/weft/vtep"
)

// etcdValue is the JSON of a VXLAN lease value for a node at ip.
func etcdValue(t *testing.T, ip string, vni int, typ string) string {
	t.Helper()
	a := netip.MustParseAddr(ip)
	b, err := json.Marshal(subnet.LeaseAttrs{PublicIP: a, BackendType: typ,
		BackendData: &subnet.VXLANData{VNI: vni, VtepMAC: vtep.DeviceMAC(a, vni)}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDaemonRejectsHostileLeases runs the daemon on the real etcd registry
// with hostile and malformed keys in etcd beside one valid peer: the
// daemon acquires, programs only the valid peer, counts every rejection by
// reason once, and drops a valid peer rewritten with a foreign VNI.
func TestDaemonRejectsHostileLeases(t *testing.T) {
	client := startEtcd(t)
	ctx := t.Context()
	put := func(k, v string) {
		t.Helper()
		if _, err := client.Put(ctx, etcd.DefaultPrefix+"/"+k, v); err != nil {
			t.Fatal(err)
		}
	}
	put("config", `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":1}}`)
	hostile := map[string]string{
		"0.0.0.0-1":      etcdValue(t, "192.168.77.66", 1, "vxlan"),   // outside_network
		"10.250.0.0-24":  etcdValue(t, "192.168.77.67", 1, "vxlan"),   // outside_network
		"10.244.8.0-25":  etcdValue(t, "192.168.77.68", 1, "vxlan"),   // prefix_length
		"10.244.9.0-24":  etcdValue(t, "192.168.77.69", 42, "vxlan"),  // backend_data (VNI)
		"10.244.10.0-24": etcdValue(t, "192.168.77.70", 1, "host-gw"), // backend_type
		"10.244.11.0-24": etcdValue(t, "127.0.0.1", 1, "vxlan"),       // public_ip
		"10.244.12.0-24": etcdValue(t, "10.244.12.5", 1, "vxlan"),     // public_ip (inside the Network)
		"10.244.13.0-24": `{"PublicIP":`,                              // malformed_value
		"garbage":        `x`,                                         // malformed_key
	}
	for k, v := range hostile {
		put("subnets/"+k, v)
	}
	put("subnets/10.244.2.0-24", etcdValue(t, "192.168.77.2", 1, "vxlan"))

	preg := prometheus.NewRegistry()
	m := NewMetrics(preg)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rej := subnet.NewRejections(log, m.LeaseRejected)
	reg := etcd.New(client, etcd.Options{TTL: time.Minute, Rejections: rej}, log)
	fb := newFakeBackend()
	d, err := New(Config{
		Registry: reg, Metrics: m, Rejections: rej,
		Node:       Node{PublicIP: netip.MustParseAddr("192.168.77.1")},
		SubnetFile: filepath.Join(t.TempDir(), "subnet.env"),
		Factories: Factories{Dataplane: func(string, *subnet.Config, subnet.Lease, int) (Dataplane, error) {
			return Dataplane{Backend: fb}, nil
		}},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })

	tb := waitTable(t, fb, 1)
	want := vtep.Table{netip.MustParsePrefix("10.244.2.0/24"): {
		MAC: vtep.DeviceMAC(netip.MustParseAddr("192.168.77.2"), 1), Addr: netip.MustParseAddr("192.168.77.2")}}
	if len(tb) != 1 || tb[netip.MustParsePrefix("10.244.2.0/24")] != want[netip.MustParsePrefix("10.244.2.0/24")] {
		t.Fatalf("programmed %v, want only the valid peer %v", tb, want)
	}
	own := d.Lease().Subnet
	if !netip.MustParsePrefix("10.244.0.0/16").Contains(own.Addr()) || own.Bits() != 24 {
		t.Fatalf("acquired %s beside the hostile keys", own)
	}
	wantCounts := map[string]float64{
		subnet.RejectOutsideNetwork: 2, subnet.RejectPrefixLength: 1, subnet.RejectBackendData: 1,
		subnet.RejectBackendType: 1, subnet.RejectPublicIP: 2, subnet.RejectMalformedValue: 1, subnet.RejectMalformedKey: 1,
	}
	waitFor(t, func() bool { return rejected(t, preg, "") == 9 })
	for reason, n := range wantCounts {
		if got := rejected(t, preg, reason); got != n {
			t.Errorf("weft_leases_rejected_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}

	// The valid peer rewritten with a foreign VNI stops being a peer.
	put("subnets/10.244.2.0-24", etcdValue(t, "192.168.77.2", 7, "vxlan"))
	waitTable(t, fb, 0)
	waitFor(t, func() bool { return rejected(t, preg, subnet.RejectBackendData) == 2 })
}

// rejected returns weft_leases_rejected_total for reason ("" sums all).
func rejected(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "weft_leases_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if reason == "" || m.GetLabel()[0].GetValue() == reason {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// startEtcd starts an embedded etcd for the test and returns a client of
// it; both are closed when the test ends.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	srv, err := etcdlocal.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	client, err := etcd.NewClient(etcd.ClientConfig{Endpoints: []string{srv.Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}
