package uvxlan

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/nettest"
)

// eventually retries f until it succeeds or 10 s have passed.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRepairsDrift(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newUVNode(t, u, "a", subnetA, false)
	b := newUVNode(t, u, "b", subnetB, false)
	connect(t, a, b)
	for _, tc := range []struct {
		name   string
		break_ []string
	}{
		{"route deleted", []string{"ip", "route", "del", b.subnet.String()}},
		{"neighbour deleted", []string{"ip", "neigh", "del", subnetAddr(b.subnet).String(), "dev", "weft-u.1"}},
		{"address deleted", []string{"ip", "addr", "flush", "dev", "weft-u.1"}},
		{"device down", []string{"ip", "link", "set", "weft-u.1", "down"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.host.MustRun(t, tc.break_...)
			eventually(t, "ping after repair", func() error { _, err := ping(a, b.podIP, "-c", "1"); return err })
		})
	}
}

// TestRestartAndRemove checks that the device and its routes outlive Run,
// that a new backend re-attaches to them, and that RemoveDevice deletes them.
func TestRestartAndRemove(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newUVNode(t, u, "a", subnetA, false)
	b := newUVNode(t, u, "b", subnetB, false)
	connect(t, a, b)
	a.stop()
	routes := a.host.MustRun(t, "ip", "route", "show", "dev", "weft-u.1")
	if !strings.Contains(routes, b.subnet.String()) {
		t.Fatalf("route gone after Run returned:\n%s", routes)
	}

	restarted, err := New(a.b.Config(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, restarted, "a again")
	a.b = restarted
	connect(t, a, b)
	if out, err := ping(a, b.podIP); err != nil {
		t.Fatalf("ping after restart: %v\n%s", err, out)
	}
	stop()

	for _, tc := range []struct {
		name    string
		dev     string
		wantErr bool
		gone    bool
	}{
		{"tap", "weft-u.1", false, true},
		{"already gone", "weft-u.1", false, true},
		{"not a tap", "eth0", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := RemoveDeviceNamed(a.host.Handle, tc.dev)
			if (err != nil) != tc.wantErr {
				t.Fatalf("remove %s: %v", tc.dev, err)
			}
			_, err = a.host.Handle.LinkByName(tc.dev)
			if gone := err != nil; gone != tc.gone {
				t.Fatalf("%s gone: %v, want %v", tc.dev, gone, tc.gone)
			}
		})
	}
	if err := RemoveDevice(a.host.Handle, 1); err != nil {
		t.Fatal(err)
	}
}
