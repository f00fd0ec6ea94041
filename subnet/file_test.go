package subnet

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFileMarshal(t *testing.T) {
	tests := []struct {
		name string
		file File
		want string
	}{
		{
			name: "IPv4",
			file: File{Network: mustPrefix(t, "10.244.0.0/16"), Subnet: GatewayPrefix(mustPrefix(t, "10.244.59.0/24")), MTU: 1450, IPMasq: true},
			want: "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.59.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
		},
		{
			name: "dual-stack",
			file: File{Network: mustPrefix(t, "10.244.0.0/16"), Subnet: GatewayPrefix(mustPrefix(t, "10.244.59.0/24")),
				IPv6Network: mustPrefix(t, "fd00:10:244::/56"), IPv6Subnet: GatewayPrefix(mustPrefix(t, "fd00:10:244:50::/64")),
				MTU: 1450, IPMasq: true},
			want: "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.59.1/24\nFLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:50::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
		},
		{
			name: "IPv6-only, no masquerade",
			file: File{IPv6Network: mustPrefix(t, "fd00:10:244::/56"), IPv6Subnet: GatewayPrefix(mustPrefix(t, "fd00:10:244:50::/64")), MTU: 1430},
			want: "FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:50::1/64\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=false\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(tt.file.Marshal()); got != tt.want {
				t.Errorf("Marshal:\n%s\nwant:\n%s", got, tt.want)
			}
			back, err := ParseFile([]byte(tt.want))
			if err != nil {
				t.Fatal(err)
			}
			if back != tt.file {
				t.Errorf("ParseFile = %+v, want %+v", back, tt.file)
			}
		})
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "flannel") // created by WriteFile
	path := filepath.Join(dir, "subnet.env")
	f := File{Network: mustPrefix(t, "10.244.0.0/16"), Subnet: mustPrefix(t, "10.244.59.1/24"), MTU: 1450, IPMasq: true}
	for i, mtu := range []int{1450, 1400} { // the second write replaces the first
		f.MTU = mtu
		if err := WriteFile(path, f); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		got, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got != f {
			t.Errorf("write %d: read back %+v, want %+v", i, got, f)
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", st.Mode().Perm())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "subnet.env" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only subnet.env (no temporary file left)", names)
	}
	if err := WriteFile(filepath.Join(path, "below-a-file"), f); err == nil {
		t.Error("WriteFile below a regular file succeeded")
	}
}

func TestReadFlanneldFile(t *testing.T) {
	// As flanneld v0.28 writes it for a dual-stack node (IPv4 lines first).
	data := "FLANNEL_NETWORK=10.42.0.0/16\nFLANNEL_SUBNET=10.42.3.1/24\nFLANNEL_IPV6_NETWORK=2001:cafe:42::/56\nFLANNEL_IPV6_SUBNET=2001:cafe:42:3::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	path := filepath.Join(t.TempDir(), "subnet.env")
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := File{Network: mustPrefix(t, "10.42.0.0/16"), Subnet: mustPrefix(t, "10.42.3.1/24"),
		IPv6Network: mustPrefix(t, "2001:cafe:42::/56"), IPv6Subnet: mustPrefix(t, "2001:cafe:42:3::1/64"), MTU: 1450, IPMasq: true}
	if f != want {
		t.Errorf("ReadFile = %+v, want %+v", f, want)
	}
	if f.Subnet.Masked() != mustPrefix(t, "10.42.3.0/24") {
		t.Errorf("node subnet %s", f.Subnet.Masked())
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing.env")); err == nil {
		t.Error("ReadFile of a missing file succeeded")
	}
}

func TestParseFileErrors(t *testing.T) {
	tests := []struct {
		name       string
		data       string
		incomplete bool
		want       string
	}{
		{"empty", "", true, "FLANNEL_NETWORK and FLANNEL_SUBNET"},
		{"no subnet", "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n", true, "FLANNEL_NETWORK and FLANNEL_SUBNET"},
		{"no MTU", "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.2.1/24\nFLANNEL_IPMASQ=true\n", true, "FLANNEL_MTU is required"},
		{"no IPMASQ", "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.2.1/24\nFLANNEL_MTU=1450\n", true, "FLANNEL_IPMASQ is required"},
		{"not KEY=VALUE", "FLANNEL_NETWORK 10.1.0.0/16\n", false, "line 1"},
		{"bad MTU", "FLANNEL_MTU=big\n", false, "FLANNEL_MTU"},
		{"MTU too small", "FLANNEL_MTU=20\n", false, "not a usable MTU"},
		{"bad IPMASQ", "FLANNEL_IPMASQ=maybe\n", false, "FLANNEL_IPMASQ"},
		{"IPv6 in FLANNEL_SUBNET", "FLANNEL_SUBNET=fd00::1/64\n", false, "wrong address family"},
		{"IPv4 in FLANNEL_IPV6_SUBNET", "FLANNEL_IPV6_SUBNET=10.1.2.1/24\n", false, "wrong address family"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ParseFile([]byte(tt.data))
			if err == nil {
				t.Fatalf("ParseFile succeeded: %+v", f)
			}
			if errors.Is(err, ErrIncompleteFile) != tt.incomplete {
				t.Errorf("errors.Is(%v, ErrIncompleteFile) = %t, want %t", err, !tt.incomplete, tt.incomplete)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestParseFileTolerates(t *testing.T) {
	data := "# written by hand\n\nFLANNEL_NETWORK=\"10.1.0.0/16\"\nFLANNEL_SUBNET='10.1.2.1/24'\nOTHER=1\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"
	f, err := ParseFile([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := File{Network: mustPrefix(t, "10.1.0.0/16"), Subnet: mustPrefix(t, "10.1.2.1/24"), MTU: 1450}
	if f != want {
		t.Errorf("ParseFile = %+v, want %+v", f, want)
	}
	if GatewayPrefix(netip.Prefix{}).IsValid() {
		t.Error("GatewayPrefix of an invalid prefix is valid")
	}
}
