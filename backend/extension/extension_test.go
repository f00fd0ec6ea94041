package extension

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// readFile returns the file's text, "" when it does not exist.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// waitFile polls path (up to 5 s) until its text is want.
func waitFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := readFile(t, path)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s:\n%s\nwant:\n%s", filepath.Base(path), got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leaseFrom parses a lease value as stored in etcd under key.
func leaseFrom(t *testing.T, key, value string) subnet.Lease {
	t.Helper()
	v4, v6, err := subnet.ParseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := subnet.Lease{Subnet: v4, IPv6Subnet: v6}
	if err := json.Unmarshal([]byte(value), &l.Attrs); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return l
}

func table(t *testing.T, self subnet.Lease, leases ...subnet.Lease) vtep.Table {
	return vtep.FromLeasesOf(subnet.BackendTypeExtension, append(leases, self), self)
}

// TestPreStartupData: what the PreStartupCommand prints, stdout and stderr,
// trimmed, is the lease's BackendData as a JSON string, and reads back as
// flanneld writes it; no command gives no data; a failing one is an error
// that carries its output.
func TestPreStartupData(t *testing.T) {
	ctx := context.Background()
	data, err := PreStartup(ctx, "", `echo "  4e:fb:7d:bf:6b:2d"; echo 'a "quoted" note' >&2`, discard())
	if err != nil {
		t.Fatal(err)
	}
	if want := `"4e:fb:7d:bf:6b:2d\na \"quoted\" note"`; data != want {
		t.Errorf("data %s, want %s", data, want)
	}
	a := subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), BackendType: subnet.BackendTypeExtension, ExtensionData: data}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"extension","BackendData":"4e:fb:7d:bf:6b:2d\na \"quoted\" note"}`; string(b) != want {
		t.Errorf("lease value %s\nwant %s", b, want)
	}
	if data, err := PreStartup(ctx, "", "", discard()); data != "" || err != nil {
		t.Errorf("no command: %q, %v", data, err)
	}
	if _, err := PreStartup(ctx, "", "echo broken; exit 3", discard()); err == nil || !strings.Contains(err.Error(), "exit status 3: broken") {
		t.Errorf("failing command: %v", err)
	}
}

// TestCommandsOnLeaseEvents runs the backend with commands that append
// their variables and stdin to files, and checks each lease event: the
// PostStartupCommand's variables, SubnetAddCommand for each peer (one lease
// written in flanneld's format with BackendData, one IPv6-only, none for a
// peer of another backend type or for ourselves), remove-then-add for a
// changed lease, SubnetRemoveCommand for a lease gone, a lease with data
// that is not a JSON string (no command, counted), a failing command
// (counted), and lease data that looks like shell code reaching the
// command only as text.
func TestCommandsOnLeaseEvents(t *testing.T) {
	dir := t.TempDir()
	log, post := filepath.Join(dir, "log"), filepath.Join(dir, "post")
	show := `printf '%s SUBNET=%s PUBLIC_IP=%s IPV6SUBNET=%s PUBLIC_IPV6=%s BASE=%s stdin=' "$1" "$SUBNET" "$PUBLIC_IP" "$IPV6SUBNET" "$PUBLIC_IPV6" "$WEFT_TEST_BASE"; IFS= read -r d; printf '%s\n' "$d"`
	self := leaseFrom(t, "10.244.1.0-24&fd00:10:244:1::-64",
		`{"PublicIP":"192.168.77.1","PublicIPv6":"fd77::1","BackendType":"extension","BackendData":"self"}`)
	cfg := Config{
		Commands: Commands{
			PostStartup:  `printf 'NETWORK=%s SUBNET=%s IPV6SUBNET=%s PUBLIC_IP=%s PUBLIC_IPV6=%s\n' "$NETWORK" "$SUBNET" "$IPV6SUBNET" "$PUBLIC_IP" "$PUBLIC_IPV6" > '` + post + `'`,
			SubnetAdd:    `{ set -- add; ` + show + `; } >> '` + log + `'; [ "$SUBNET" != 10.244.66.0/24 ] || exit 1`,
			SubnetRemove: `{ set -- del; ` + show + `; } >> '` + log + `'`,
		},
		Network:     netip.MustParsePrefix("10.244.0.0/16"),
		IPv6Network: netip.MustParsePrefix("fd00:10:244::/56"),
		Lease:       self,
		Env:         []string{"PATH=" + os.Getenv("PATH"), "WEFT_TEST_BASE=kept"},
	}
	b, err := New(cfg, discard())
	if err != nil {
		t.Fatal(err)
	}
	flanneld := leaseFrom(t, "10.244.2.0-24", `{"PublicIP":"192.168.77.2","PublicIPv6":null,"BackendType":"extension","BackendData":"4e:fb:7d:bf:6b:2d"}`)
	v6only := leaseFrom(t, "0.0.0.0-0&fd00:10:244:3::-64", `{"PublicIP":"0.0.0.0","PublicIPv6":"fd77::3","BackendType":"extension"}`)
	vx := leaseFrom(t, "10.244.4.0-24", `{"PublicIP":"192.168.77.4","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2e"}}`)
	first := table(t, self, flanneld, v6only, vx)
	first[self.Subnet] = vtep.Peer{Addr: self.Attrs.PublicIP} // ourselves: never acted on
	b.Set(first)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-b.Ready():
	case err := <-done:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("not ready")
	}
	if got, want := readFile(t, post), "NETWORK=10.244.0.0/16 SUBNET=10.244.1.0/24 IPV6SUBNET=fd00:10:244:1::/64 PUBLIC_IP=192.168.77.1 PUBLIC_IPV6=fd77::1\n"; got != want {
		t.Errorf("PostStartupCommand saw:\n%s\nwant:\n%s", got, want)
	}
	want := "add SUBNET=10.244.2.0/24 PUBLIC_IP=192.168.77.2 IPV6SUBNET= PUBLIC_IPV6= BASE=kept stdin=4e:fb:7d:bf:6b:2d\n" +
		"add SUBNET= PUBLIC_IP= IPV6SUBNET=fd00:10:244:3::/64 PUBLIC_IPV6=fd77::3 BASE=kept stdin=\n"
	waitFile(t, log, want)

	// The flanneld peer moves to another address, the IPv6-only one goes,
	// one with shell code in its data and one whose command fails come.
	moved := leaseFrom(t, "10.244.2.0-24", `{"PublicIP":"192.168.77.22","PublicIPv6":null,"BackendType":"extension","BackendData":"4e:fb:7d:bf:6b:2d"}`)
	pwned := filepath.Join(dir, "pwned")
	code := leaseFrom(t, "10.244.5.0-24", `{"PublicIP":"192.168.77.5","PublicIPv6":null,"BackendType":"extension","BackendData":"$(touch `+pwned+`); ; touch `+pwned+`"}`)
	fails := leaseFrom(t, "10.244.66.0-24", `{"PublicIP":"192.168.77.66","PublicIPv6":null,"BackendType":"extension"}`)
	b.Set(table(t, self, moved, code, fails))
	want += "del SUBNET= PUBLIC_IP= IPV6SUBNET=fd00:10:244:3::/64 PUBLIC_IPV6=fd77::3 BASE=kept stdin=\n" +
		"del SUBNET=10.244.2.0/24 PUBLIC_IP=192.168.77.2 IPV6SUBNET= PUBLIC_IPV6= BASE=kept stdin=4e:fb:7d:bf:6b:2d\n" +
		"add SUBNET=10.244.2.0/24 PUBLIC_IP=192.168.77.22 IPV6SUBNET= PUBLIC_IPV6= BASE=kept stdin=4e:fb:7d:bf:6b:2d\n" +
		"add SUBNET=10.244.5.0/24 PUBLIC_IP=192.168.77.5 IPV6SUBNET= PUBLIC_IPV6= BASE=kept stdin=$(touch " + pwned + "); ; touch " + pwned + "\n" +
		"add SUBNET=10.244.66.0/24 PUBLIC_IP=192.168.77.66 IPV6SUBNET= PUBLIC_IPV6= BASE=kept stdin=\n"
	waitFile(t, log, want)
	if _, err := os.Stat(pwned); err == nil {
		t.Error("lease data ran as shell code")
	}
	waitStats := func(what string, want map[string]uint64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			ev := b.Stats().Events
			ok := true
			for k, v := range want {
				ok = ok && ev[k] == v
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: events %v, want %v", what, ev, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitStats("after the changes", map[string]uint64{"subnet_add": 5, "subnet_remove": 2, "command_failed": 1})

	// Data that is not a JSON string: the command does not run.
	bad := leaseFrom(t, "10.244.7.0-24", `{"PublicIP":"192.168.77.7","PublicIPv6":null,"BackendType":"extension","BackendData":{"VtepMAC":"x"}}`)
	b.Set(table(t, self, moved, code, fails, bad))
	waitStats("bad data", map[string]uint64{"subnet_add": 5, "command_failed": 2})
	if got := readFile(t, log); got != want {
		t.Errorf("a command ran for data that is not a string:\n%s", strings.TrimPrefix(got, want))
	}
}

// TestPostStartupFailureEndsRun: a failing PostStartupCommand ends Run with
// an error that names it and carries its output, and the backend never
// becomes ready.
func TestPostStartupFailureEndsRun(t *testing.T) {
	l := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24")}
	b, err := New(Config{Commands: Commands{PostStartup: "echo no device; exit 1"}, Lease: l}, discard())
	if err != nil {
		t.Fatal(err)
	}
	b.Set(vtep.Table{})
	err = b.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `PostStartupCommand "echo no device; exit 1": exit status 1: no device`) {
		t.Errorf("Run: %v", err)
	}
	select {
	case <-b.Ready():
		t.Error("ready after a failed PostStartupCommand")
	default:
	}
}
