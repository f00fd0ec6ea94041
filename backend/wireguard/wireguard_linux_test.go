package wireguard

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// TestBackendInNamespace runs the backend in a namespace: on this kernel
// (no WireGuard module) it must pick the in-process device, create it in
// the namespace with Flannel's name, address, MTU and route, refuse a
// forced kernel device, and re-create a deleted device.
func TestBackendInNamespace(t *testing.T) {
	n := nettest.NewNS(t, "wg")
	priv, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	force := true
	if _, _, err := openDevice(n.Handle, n.Path, "wgprobe", 1420, &force, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Log("this kernel has WireGuard: the kernel path was taken")
		nettest.MustRun(t, n, "ip", "link", "del", "wgprobe")
	} else if !strings.Contains(err.Error(), "the kernel has no WireGuard") {
		t.Fatalf("forced kernel device: %v", err)
	}
	c := baseConfig(subnet.WireGuardSeparate)
	c.IPv6Subnet, c.Handle, c.NetNS, c.PrivateKey, c.MTU = netip.Prefix{}, n.Handle, n.Path, priv, 1420
	b, err := New(c, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	b.Set(vtep.Table{pfx("10.244.2.0/24"): {Addr: ip("192.168.77.2"), Data: keyA, Port: 51820}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-b.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	if b.Kernel() && !strings.Contains(nettest.MustRun(t, n, "ip", "-d", "-o", "link"), "wireguard") {
		t.Fatal("kernel device expected")
	}
	check := func() string {
		links := nettest.MustRun(t, n, "ip", "-o", "link")
		addr := nettest.MustRun(t, n, "ip", "-o", "-4", "addr")
		route := nettest.MustRun(t, n, "ip", "route", "show", "10.244.0.0/16")
		if !strings.Contains(links, "flannel-wg: <POINTOPOINT") || !strings.Contains(links, "mtu 1420") ||
			!strings.Contains(addr, "flannel-wg    inet 10.244.1.0/32") ||
			!strings.HasPrefix(route, "10.244.0.0/16 dev flannel-wg proto 87 scope link") {
			return links + addr + route
		}
		return ""
	}
	if msg := check(); msg != "" {
		t.Fatalf("device state:\n%s", msg)
	}
	nettest.MustRun(t, n, "ip", "link", "del", "flannel-wg")
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _ := n.Run("ip", "-o", "link")
		if strings.Contains(out, "flannel-wg") && check() == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("device not re-created: %s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b.Stats().Repairs["device"] != 1 {
		t.Errorf("repairs %v", b.Stats().Repairs)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestRemoveDevices(t *testing.T) {
	n := nettest.NewNS(t, "wgrm")
	nettest.MustRun(t, n, "ip", "tuntap", "add", "flannel-wg", "mode", "tun")
	nettest.MustRun(t, n, "ip", "tuntap", "add", "other", "mode", "tun")
	if err := RemoveDevices(n.Handle); err != nil {
		t.Fatal(err)
	}
	links := nettest.MustRun(t, n, "ip", "-o", "link")
	if strings.Contains(links, "flannel-wg") || !strings.Contains(links, "other") {
		t.Errorf("links after RemoveDevices:\n%s", links)
	}
	if err := RemoveDevices(n.Handle); err != nil {
		t.Errorf("nothing to remove: %v", err)
	}
}
