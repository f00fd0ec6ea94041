package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
)

func v4Range(s string) Range {
	p := netip.MustParsePrefix(s)
	return Range{Subnet: p.Masked(), Gateway: p.Addr(), ID: 0}
}

func TestStoreAllocate(t *testing.T) {
	cases := []struct {
		name   string
		rng    Range
		pods   int
		want   []string // addresses in order of allocation
		errIdx int      // index of the first ADD that fails with ErrExhausted, -1 none
	}{
		{"skips gateway, network and broadcast", v4Range("10.0.0.1/29"), 6, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}, 5},
		{"/30 holds one pod", v4Range("10.0.0.1/30"), 2, []string{"10.0.0.2"}, 1},
		{"gateway not first", v4Range("10.0.0.5/29"), 3, []string{"10.0.0.6", "10.0.0.1", "10.0.0.2"}, -1},
		{"/31 holds none", v4Range("10.0.0.0/31"), 1, nil, 0},
		{"/32 holds none", v4Range("10.0.0.1/32"), 1, nil, 0},
		{"last reservation outside the range", v4Range("10.0.0.1/29"), 2, []string{"10.0.0.2", "10.0.0.3"}, -1},
		{"wraps around after the last address", v4Range("10.0.0.1/29"), 3, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4"}, -1},
		{"IPv6", Range{Subnet: netip.MustParsePrefix("fd00::/64"), Gateway: netip.MustParseAddr("fd00::1"), ID: 1}, 2, []string{"fd00::2", "fd00::3"}, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, dir := openTestStore(t)
			switch c.name { // round-robin resumes after the last reservation
			case "gateway not first":
				os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte("10.0.0.5"), 0o600)
			case "last reservation outside the range":
				os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte("192.168.0.9"), 0o600)
			case "wraps around after the last address":
				os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte("10.0.0.6"), 0o600)
			}
			var got []string
			for i := range c.pods {
				addrs, err := allocate(s, Attachment{fmt.Sprint("c", i), "eth0"}, []Range{c.rng}, nil)
				if i == c.errIdx {
					if !errors.Is(err, ErrExhausted) {
						t.Fatalf("ADD %d: %v, want ErrExhausted", i, err)
					}
					break
				}
				if err != nil {
					t.Fatalf("ADD %d: %v", i, err)
				}
				got = append(got, addrs[0].Addr().String())
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("allocated %v, want %v", got, c.want)
			}
		})
	}
}

func TestStoreReleaseAndDuplicate(t *testing.T) {
	s, _ := openTestStore(t)
	a := Attachment{"c1", "eth0"}
	rs := []Range{v4Range("10.0.0.1/24"), {Subnet: netip.MustParsePrefix("fd00::/64"), Gateway: netip.MustParseAddr("fd00::1"), ID: 1}}
	got, err := allocate(s, a, rs, nil)
	if err != nil || len(got) != 2 {
		t.Fatalf("allocate: %v %v", got, err)
	}
	if _, err := allocate(s, a, rs, nil); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("second allocate: %v, want ErrDuplicate", err)
	}
	if held, _ := lookup(s, a); len(held) != 2 || !slices.Contains(held, got[1].Addr()) {
		t.Fatalf("lookup %v, want %v", held, got)
	}
	if err := release(s, a); err != nil {
		t.Fatalf("release: %v", err)
	}
	if held, _ := lookup(s, a); len(held) != 0 {
		t.Fatalf("held after release: %v", held)
	}
	if err := release(s, a); err != nil {
		t.Fatalf("second release: %v", err)
	}
	// The next pod does not get the address just released (round-robin).
	next, _ := allocate(s, Attachment{"c2", "eth0"}, rs[:1], nil)
	if next[0] == got[0] {
		t.Fatalf("released address %s handed out at once", next[0])
	}
}

func TestStoreAllOrNothing(t *testing.T) {
	s, _ := openTestStore(t)
	full := v4Range("10.0.0.1/30")
	if _, err := allocate(s, Attachment{"x", "eth0"}, []Range{full}, nil); err != nil {
		t.Fatal(err)
	}
	v6 := Range{Subnet: netip.MustParsePrefix("fd00::/64"), Gateway: netip.MustParseAddr("fd00::1"), ID: 1}
	if _, err := allocate(s, Attachment{"y", "eth0"}, []Range{v6, full}, nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("allocate: %v", err)
	}
	if held, _ := lookup(s, Attachment{"y", "eth0"}); len(held) != 0 {
		t.Fatalf("failed allocation kept %v", held)
	}
	if held, _ := lookup(s, Attachment{"x", "eth0"}); len(held) != 1 {
		t.Fatalf("rollback touched another attachment: %v", held)
	}
}

func TestStoreGC(t *testing.T) {
	s, dir := openTestStore(t)
	r := []Range{v4Range("10.0.0.1/24")}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := allocate(s, Attachment{id, "eth0"}, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	// A reservation from an old host-local holds only the container ID.
	os.WriteFile(filepath.Join(dir, "10.0.0.200"), []byte("legacy"), 0o600)
	valid := []types.GCAttachment{{ContainerID: "a", IfName: "eth0"}, {ContainerID: "c", IfName: "eth0"}, {ContainerID: "legacy", IfName: "eth0"}}
	gone, err := gc(s, dir, valid)
	if err != nil || len(gone) != 1 || gone[0] != (Attachment{"b", "eth0"}) {
		t.Fatalf("GC released %v, %v; want only b/eth0", gone, err)
	}
	left, _ := holders(s, dir)
	if len(left) != 3 || left[Attachment{"b", "eth0"}.key()] {
		t.Fatalf("left %v", left)
	}
	for _, f := range []string{"lock", "last_reserved_ip.0"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("GC removed %s: %v", f, err)
		}
	}
}

// TestStoreLayout: reservations land where host-local keeps them for the
// same configuration, <ipam.dataDir>/<network>/<address>, in host-local's
// file format.
func TestStoreLayout(t *testing.T) {
	ipamDir := t.TempDir()
	conf, err := ParseConfig([]byte(`{"name":"cbr0","type":"flannel","dataDir":"/nonexistent","ipam":{"dataDir":"` + ipamDir + `"}}`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := openStore(conf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := allocate(s, Attachment{"c1", "eth0"}, []Range{v4Range("10.0.0.1/24")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(ipamDir, "cbr0", got[0].Addr().String()))
	if err != nil || string(b) != "c1\r\neth0" {
		t.Fatalf("reservation file: %q, %v", b, err)
	}
}

func openTestStore(t *testing.T) (*disk.Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := disk.New("net", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, filepath.Join(dir, "net")
}
