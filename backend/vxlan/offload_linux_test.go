package vxlan

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

func TestChecksumBug(t *testing.T) {
	for release, want := range map[string]bool{
		"4.19.0-27-amd64": true, "5.4.0-150-generic": true, "5.6.19": true,
		"5.7.0": false, "5.10.0-32-cloud-amd64": false, "6.18.0": false, "10.0": false,
	} {
		got, err := checksumBug(release)
		if err != nil || got != want {
			t.Errorf("checksumBug(%q) = %v, %v; want %v", release, got, err, want)
		}
	}
	for _, bad := range []string{"", "linux", "5", "x.7"} {
		if _, err := checksumBug(bad); err == nil {
			t.Errorf("checksumBug(%q) succeeded", bad)
		}
	}
	if _, err := (Config{Handle: nil}).withDefaults(); err == nil {
		t.Error("withDefaults without a handle succeeded")
	}
}

// txChecksum reads dev's tx-checksum-ip-generic inside nd with ethtool -k.
func txChecksum(t *testing.T, nd *node, dev string) string {
	t.Helper()
	for _, l := range strings.Split(nettest.MustRun(t, nd, "ethtool", "-k", dev), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), txChecksumFeature+":"); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatalf("ethtool -k %s has no %s", dev, txChecksumFeature)
	return ""
}

// TestTxChecksumOffload: on a kernel older than 5.7 (a faked release) the
// backend turns its devices' transmit checksum offload off, also on a device
// it recreates; on 5.7 and later (and on this machine's kernel) it leaves it
// on, as the kernel creates it.
func TestTxChecksumOffload(t *testing.T) {
	real, err := kernelRelease()
	if err != nil {
		t.Fatal(err)
	}
	if bug, err := checksumBug(real); err != nil || bug {
		t.Fatalf("this test needs a kernel ≥ 5.7 (on which the device starts with the offload on); have %s (%v)", real, err)
	}
	for _, tt := range []struct{ release, want string }{
		{"5.4.0-150-generic", "off"},
		{"4.19.0-27-amd64", "off"},
		{"5.7.0", "on"},
		{"", "on"}, // the running kernel
	} {
		t.Run(fmt.Sprintf("kernel=%q", tt.release), func(t *testing.T) {
			u := nettest.NewUnderlay(t, ul4, 0)
			n1 := newNode(t, u, 1)
			c := n1.config()
			c.KernelRelease = tt.release
			b := newBackend(t, c)
			b.Set(vtep.Table{})
			start(t, b)
			waitReady(t, b)
			for _, dev := range []string{b.cfg.Name, b.cfg.NameV6} {
				if got := txChecksum(t, n1, dev); got != tt.want {
					t.Errorf("%s: %s %s, want %s", dev, txChecksumFeature, got, tt.want)
				}
			}
			// A device deleted by hand is recreated with the same setting.
			nettest.MustRun(t, n1, "ip", "link", "del", b.cfg.Name)
			eventually(t, 10*time.Second, "device recreated", func() (bool, string) {
				_, err := n1.Handle.LinkByName(b.cfg.Name)
				return err == nil, fmt.Sprint(err)
			})
			eventually(t, 5*time.Second, "setting on the recreated device", func() (bool, string) {
				got := txChecksum(t, n1, b.cfg.Name)
				return got == tt.want, got
			})
		})
	}
}
