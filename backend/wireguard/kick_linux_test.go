package wireguard

import (
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
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

func TestLastHandshakes(t *testing.T) {
	a, b, c := newKey(t).PublicKey(), newKey(t).PublicKey(), newKey(t).PublicKey()
	text := "private_key=00\nlisten_port=51820\n" +
		"public_key=" + hex.EncodeToString(a[:]) + "\nendpoint=192.168.77.2:51820\nlast_handshake_time_sec=1764590000\nlast_handshake_time_nsec=250\nallowed_ip=10.244.2.0/24\n" +
		"public_key=" + hex.EncodeToString(b[:]) + "\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\n"
	got, err := parseUAPIPeers(text)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := got[a.String()]; !ok || !p.LastHandshake.Equal(time.Unix(1764590000, 250)) {
		t.Errorf("a: %+v %v", p, ok)
	}
	if p, ok := got[b.String()]; !ok || !p.LastHandshake.IsZero() {
		t.Errorf("b (never): %+v %v", p, ok)
	}
	if _, ok := got[c.String()]; ok {
		t.Error("c is not a peer")
	}
	if len(got) != 2 {
		t.Errorf("%d peers, want 2: %v", len(got), got)
	}
}

// TestWhoStartsTheHandshake sets up two in-process devices on a veth.
//
// With the second set up 1.5 s after the first, whatever the first sent to
// it was lost and the first will not try again before its 5 s retry. The
// second must then start the handshake: at once when its key is the lower
// one (kicksFirst), after kickDelay when it is the higher one (it does not
// start at once, so that two nodes set up together do not cross their
// initiations), also when a persistent keepalive is configured (turning it
// on would start a handshake at once), which it turns on then.
//
// Set up together (the lower one second, so that its initiation is
// answered), the higher one must not start another handshake after
// kickDelay: the last handshake on both sides stays the first one.
func TestWhoStartsTheHandshake(t *testing.T) {
	for _, tc := range []struct {
		name        string
		secondFirst bool // the second node has the lower key
		gap         time.Duration
		keepalive   int
	}{
		{"second kicks first", true, 1500 * time.Millisecond, 0},
		{"first kicks first", false, 1500 * time.Millisecond, 0},
		{"first kicks first, persistent keepalive", false, 1500 * time.Millisecond, 25},
		{"set up together", true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k1, k2 := newKey(t), newKey(t)
			p1, p2 := k1.PublicKey(), k2.PublicKey()
			if kicksFirst(p2, p1) != tc.secondFirst {
				k1, k2, p1, p2 = k2, k1, p2, p1
			}
			n1, n2 := nettest.NewNS(t, "wgk1"), nettest.NewNS(t, "wgk2")
			nettest.Veth(t, n1, "eth0", n2, "eth0")
			for _, x := range []struct {
				n    *nettest.NS
				addr string
			}{{n1, "192.168.78.1/24"}, {n2, "192.168.78.2/24"}} {
				if err := namespace.AddAddr(x.n, "eth0", netip.MustParsePrefix(x.addr)); err != nil {
					t.Fatal(err)
				}
			}
			c := baseConfig(subnet.WireGuardSeparate)
			c.Keepalive = tc.keepalive
			open := func(n *nettest.NS, key wgtypes.Key, peer wgtypes.Key, endpoint string) *userDevice {
				t.Helper()
				d, err := newUserDevice(n.Handle, n.Path, DeviceName, 1420, slog.New(slog.NewTextHandler(io.Discard, nil)))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { d.Close() })
				if err := d.Configure(c, &key, 51820, nil, nil); err != nil {
					t.Fatal(err)
				}
				set := []Peer{{Key: peer.String(), Endpoint: netip.MustParseAddrPort(endpoint), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24")}}}
				if err := d.Configure(c, nil, 0, set, nil); err != nil {
					t.Fatal(err)
				}
				return d
			}
			d1 := open(n1, k1, p2, "192.168.78.2:51820")
			time.Sleep(tc.gap)
			start := time.Now()
			d2 := open(n2, k2, p1, "192.168.78.1:51820")
			at := waitHandshake(t, d2, p1, start.Add(3*time.Second))
			if at.IsZero() {
				t.Fatal("no handshake within 3 s of setting up the second node")
			}
			took := at.Sub(start)
			if tc.secondFirst && took >= kickDelay {
				t.Errorf("handshake %v after the second node's set-up; it has the lower key and should start at once", took)
			}
			if !tc.secondFirst && took < kickDelay-100*time.Millisecond {
				t.Errorf("handshake %v after the second node's set-up; with the higher key it should wait %v", took, kickDelay)
			}
			at1 := waitHandshake(t, d1, p2, time.Now().Add(time.Second))
			if at1.IsZero() {
				t.Fatal("the first node has no session")
			}
			if tc.keepalive > 0 {
				for _, d := range []*userDevice{d1, d2} {
					if text, _ := d.dev.IpcGet(); !strings.Contains(text, fmt.Sprintf("persistent_keepalive_interval=%d", tc.keepalive)) {
						t.Errorf("persistent keepalive not on:\n%s", text)
					}
				}
			}
			if tc.gap == 0 {
				time.Sleep(kickDelay + 500*time.Millisecond)
				if again := waitHandshake(t, d2, p1, time.Now()); !again.Equal(at) {
					t.Errorf("another handshake %v after the first one: the higher node started one although a handshake completed", again.Sub(at))
				}
				if again := waitHandshake(t, d1, p2, time.Now()); !again.Equal(at1) {
					t.Errorf("the first node's last handshake moved by %v", again.Sub(at1))
				}
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
		have, err := d.Peers()
		if err != nil {
			t.Fatal(err)
		}
		if last := have[peer.String()].LastHandshake; !last.IsZero() {
			return last
		}
		if time.Now().After(deadline) {
			return time.Time{}
		}
		time.Sleep(10 * time.Millisecond)
	}
}
