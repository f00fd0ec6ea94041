package wireguard

import (
	"encoding/hex"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weft-net/weft/internal/nettest"
	"github.com/weft-net/weft/subnet"
)

func TestKicksFirst(t *testing.T) {
	for range 50 {
		a, b := newKey(t).PublicKey(), newKey(t).PublicKey()
		if kicksFirst(a, b) == kicksFirst(b, a) {
			t.Fatalf("%s and %s: kicksFirst %v both ways", a, b, kicksFirst(a, b))
		}
		if kicksFirst(a, a) {
			t.Fatalf("%s kicks itself first", a)
		}
	}
}

func TestLastHandshake(t *testing.T) {
	a, b, c := newKey(t).PublicKey(), newKey(t).PublicKey(), newKey(t).PublicKey()
	text := "private_key=00\nlisten_port=51820\n" +
		"public_key=" + hex.EncodeToString(a[:]) + "\nendpoint=192.168.77.2:51820\nlast_handshake_time_sec=1764590000\nlast_handshake_time_nsec=250\nallowed_ip=10.244.2.0/24\n" +
		"public_key=" + hex.EncodeToString(b[:]) + "\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\n"
	if got, ok := lastHandshake(text, a); !ok || !got.Equal(time.Unix(1764590000, 250)) {
		t.Errorf("a: %v %v", got, ok)
	}
	if got, ok := lastHandshake(text, b); !ok || !got.IsZero() {
		t.Errorf("b (never): %v %v", got, ok)
	}
	if _, ok := lastHandshake(text, c); ok {
		t.Error("c is not a peer")
	}
}

// TestWhoStartsTheHandshake sets up two in-process devices on a veth, the
// second 1.5 s after the first, so that whatever the first sent to it
// was lost and the first will not try again before its 5 s retry. The
// second must then start the handshake: at once when its key is the lower
// one (kicksFirst), after kickDelay when it is the higher one (it does not
// start at once, so that two nodes set up together do not cross their
// initiations).
func TestWhoStartsTheHandshake(t *testing.T) {
	for _, name := range []string{"second kicks first", "first kicks first"} {
		t.Run(name, func(t *testing.T) {
			k1, k2 := newKey(t), newKey(t)
			p1, p2 := k1.PublicKey(), k2.PublicKey()
			if secondFirst := name == "second kicks first"; kicksFirst(p2, p1) != secondFirst {
				k1, k2, p1, p2 = k2, k1, p2, p1
			}
			n1, n2 := nettest.NewNS(t, "wgk1"), nettest.NewNS(t, "wgk2")
			nettest.Veth(t, n1, "eth0", n2, "eth0")
			for _, x := range []struct {
				n    *nettest.NS
				addr string
			}{{n1, "192.168.78.1/24"}, {n2, "192.168.78.2/24"}} {
				if err := nettest.AddAddr(x.n, "eth0", netip.MustParsePrefix(x.addr)); err != nil {
					t.Fatal(err)
				}
			}
			c := baseConfig(subnet.WireGuardSeparate)
			open := func(n *nettest.NS, key wgtypes.Key, peer wgtypes.Key, endpoint string) *userDevice {
				t.Helper()
				d, err := newUserDevice(n.Handle, n.Path, DeviceName, 1420, slog.New(slog.NewTextHandler(io.Discard, nil)))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { d.Close() })
				set := []Peer{{Key: peer.String(), Endpoint: netip.MustParseAddrPort(endpoint), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24")}}}
				if err := d.Configure(c, &key, 51820, set, nil); err != nil {
					t.Fatal(err)
				}
				return d
			}
			d1 := open(n1, k1, p2, "192.168.78.2:51820")
			time.Sleep(1500 * time.Millisecond)
			start := time.Now()
			d2 := open(n2, k2, p1, "192.168.78.1:51820")
			at := waitHandshake(t, d2, p1, start.Add(3*time.Second))
			if at.IsZero() {
				t.Fatal("no handshake within 3 s of setting up the second node")
			}
			took := at.Sub(start)
			if kicksFirst(p2, p1) && took >= kickDelay {
				t.Errorf("handshake %v after the second node's set-up; it has the lower key and should start at once", took)
			}
			if !kicksFirst(p2, p1) && took < kickDelay-100*time.Millisecond {
				t.Errorf("handshake %v after the second node's set-up; with the higher key it should wait %v", took, kickDelay)
			}
			if waitHandshake(t, d1, p2, time.Now().Add(time.Second)).IsZero() {
				t.Error("the first node has no session")
			}
		})
	}
}

func newKey(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// waitHandshake polls d until a handshake with peer completed or deadline
// passes (then it returns the zero time).
func waitHandshake(t *testing.T, d *userDevice, peer wgtypes.Key, deadline time.Time) time.Time {
	t.Helper()
	for {
		text, err := d.dev.IpcGet()
		if err != nil {
			t.Fatal(err)
		}
		if last, _ := lastHandshake(text, peer); !last.IsZero() {
			return last
		}
		if time.Now().After(deadline) {
			return time.Time{}
		}
		time.Sleep(10 * time.Millisecond)
	}
}
