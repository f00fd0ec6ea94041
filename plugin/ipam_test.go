package plugin

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// oldStore writes a store as releases before the shared one left it in
// dataDir/ipam/<network>: reservations (address: key), its round-robin
// marker and lock.
func oldStore(t *testing.T, conf *Config, files map[string]string) {
	t.Helper()
	dir := conf.oldStoreDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files["lock"] = ""
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMigrate: an older release's store moves into the shared store; an
// address both reserve for different attachments stays with the shared
// store's and is reported, naming both, until one of them is released.
func TestMigrate(t *testing.T) {
	const a, b, x = "a\r\neth0", "b\r\neth0", "flannel-x\r\neth0"
	r := []Range{v4Range("10.0.0.1/24")}
	cases := []struct {
		name     string
		shared   map[string]string // the shared store's files before
		old      map[string]string // the old store's, besides lock
		want     map[string]string // the shared store's files after
		twice    []string          // in the error
		oldAfter []string          // files left in the old directory; nil: it is gone
		next     string            // the next address allocated, if set
	}{
		{name: "moves reservations and marker",
			old:  map[string]string{"10.0.0.2": a, "10.0.0.3": b, "last_reserved_ip.0": "10.0.0.3"},
			want: map[string]string{"10.0.0.2": a, "10.0.0.3": b, "last_reserved_ip.0": "10.0.0.3"},
			next: "10.0.0.4"},
		{name: "keeps the shared store's marker",
			shared: map[string]string{"10.0.0.9": x, "last_reserved_ip.0": "10.0.0.9"},
			old:    map[string]string{"10.0.0.2": a, "last_reserved_ip.0": "10.0.0.2"},
			want:   map[string]string{"10.0.0.2": a, "10.0.0.9": x, "last_reserved_ip.0": "10.0.0.9"}},
		{name: "a move cut short",
			shared: map[string]string{"10.0.0.2": a},
			old:    map[string]string{"10.0.0.2": a, "10.0.0.3": b},
			want:   map[string]string{"10.0.0.2": a, "10.0.0.3": b}},
		{name: "reserved twice",
			shared:   map[string]string{"10.0.0.3": x},
			old:      map[string]string{"10.0.0.2": a, "10.0.0.3": b},
			want:     map[string]string{"10.0.0.2": a, "10.0.0.3": x},
			twice:    []string{"10.0.0.3", "flannel-x/eth0", "b/eth0"},
			oldAfter: []string{"10.0.0.3", "lock"}},
		{name: "a file weft never wrote stays",
			old:      map[string]string{"10.0.0.2": a, "notes": "mine"},
			want:     map[string]string{"10.0.0.2": a},
			oldAfter: []string{"notes"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf := testConf(t)
			s, err := openStore(conf)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for name, content := range c.shared {
				os.WriteFile(filepath.Join(conf.storeDir(), name), []byte(content), 0o600)
			}
			oldStore(t, conf, c.old)
			err = migrate(s, conf)
			if len(c.twice) == 0 && err != nil {
				t.Fatalf("migrate: %v", err)
			}
			if len(c.twice) > 0 {
				if !errors.Is(err, ErrReservedTwice) {
					t.Fatalf("migrate: %v, want ErrReservedTwice", err)
				}
				for _, w := range c.twice {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %s", err, w)
					}
				}
			}
			got := dirFiles(t, conf.storeDir())
			delete(got, "lock")
			if !maps.Equal(got, c.want) {
				t.Errorf("shared store after: %v, want %v", got, c.want)
			}
			left := slices.Sorted(maps.Keys(dirFiles(t, conf.oldStoreDir())))
			if !slices.Equal(left, c.oldAfter) {
				t.Errorf("old store after: %v, want %v", left, c.oldAfter)
			}
			if _, err := os.Stat(filepath.Dir(conf.oldStoreDir())); (c.oldAfter == nil) != errors.Is(err, os.ErrNotExist) {
				t.Errorf("dataDir/ipam after: %v", err)
			}
			if c.next != "" {
				if got, err := allocate(s, Attachment{"new", "eth0"}, r, nil); err != nil || got[0].Addr().String() != c.next {
					t.Errorf("next allocation %v, %v; want %s", got, err, c.next)
				}
			}
		})
	}
}

// TestMigrateReservedTwiceResolves: releasing either holder of an address
// reserved twice (DEL frees the attachment in both stores) lets the move
// complete, and the address stays reserved for the other.
func TestMigrateReservedTwiceResolves(t *testing.T) {
	for _, del := range []Attachment{{"b", "eth0"}, {"flannel-x", "eth0"}} {
		t.Run(del.ContainerID, func(t *testing.T) {
			conf := testConf(t)
			s, err := openStore(conf)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			os.WriteFile(filepath.Join(conf.storeDir(), "10.0.0.3"), []byte("flannel-x\r\neth0"), 0o600)
			oldStore(t, conf, map[string]string{"10.0.0.3": "b\r\neth0"})
			if err := migrate(s, conf); !errors.Is(err, ErrReservedTwice) {
				t.Fatalf("migrate: %v", err)
			}
			if held, _ := lookup(s, Attachment{"b", "eth0"}); len(held) != 0 {
				t.Fatalf("b holds %v in the shared store", held)
			}
			// DEL of del: both stores.
			if err := errors.Join(release(s, del), releaseOld(conf, del)); err != nil {
				t.Fatal(err)
			}
			if err := migrate(s, conf); err != nil {
				t.Fatalf("migrate after DEL of %v: %v", del, err)
			}
			keep := "b\r\neth0"
			if del.ContainerID == "b" {
				keep = "flannel-x\r\neth0"
			}
			if got := dirFiles(t, conf.storeDir()); got["10.0.0.3"] != keep {
				t.Fatalf("10.0.0.3 reserved for %q, want %q", got["10.0.0.3"], keep)
			}
			if _, err := os.Stat(conf.oldStoreDir()); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("old store still there: %v", err)
			}
		})
	}
}

// TestMigrateNothing: without an old store, and when the old store's
// directory is the shared store's (dataDir/ipam = ipam.dataDir), migrate
// touches nothing.
func TestMigrateNothing(t *testing.T) {
	conf := testConf(t)
	s, err := openStore(conf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := migrate(s, conf); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(conf.oldStoreDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("migrate made %s: %v", conf.oldStoreDir(), err)
	}

	conf.IPAM.DataDir = filepath.Join(conf.DataDir, "ipam")
	same, err := openStore(conf)
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if _, err := allocate(same, Attachment{"a", "eth0"}, []Range{v4Range("10.0.0.1/24")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := migrate(same, conf); err != nil {
		t.Fatal(err)
	}
	if got := dirFiles(t, conf.storeDir()); got["10.0.0.2"] != "a\r\neth0" || got["lock"] != "" {
		t.Fatalf("the store shared with the old path: %v", got)
	}
	if old, err := openOldStore(conf); old != nil || err != nil {
		t.Fatalf("the shared store opened as the old one: %v", err)
	}
}

// testConf is a parsed config whose dataDir and ipam.dataDir are test
// directories.
func testConf(t *testing.T) *Config {
	t.Helper()
	dir := t.TempDir()
	conf, err := ParseConfig([]byte(`{"name":"net","dataDir":"` + filepath.Join(dir, "weft") + `","ipam":{"dataDir":"` + filepath.Join(dir, "networks") + `"}}`))
	if err != nil {
		t.Fatal(err)
	}
	return conf
}

// dirFiles maps the names of the files in dir to their contents.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(b)
	}
	return files
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
