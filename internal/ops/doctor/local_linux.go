package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/weft-net/weft/subnet"
)

const fixStartWeftd = "start weftd on this node and see its log (journalctl -u weftd, or its stderr)"

// checkWeftd asks weftd's health endpoint whether it runs and is ready.
func checkWeftd(ctx context.Context, s *state) {
	if s.HealthAddr == "" {
		return
	}
	base := "http://" + s.HealthAddr
	code, body, err := s.get(ctx, base+"/healthz")
	if err != nil {
		s.r.add("weftd/running", Fail, fixStartWeftd+" (or pass --health-addr if it serves elsewhere)", "%s/healthz: %v", base, err)
		return
	}
	s.r.ok("weftd/running", "%s/healthz: %d %s", base, code, body)
	code, body, err = s.get(ctx, base+"/readyz")
	switch {
	case err != nil:
		s.r.add("weftd/ready", Fail, fixStartWeftd, "%s/readyz: %v", base, err)
	case code != 200:
		fix := "see weftd's log: it is waiting for its lease, the subnet file or the dataplane"
		if strings.Contains(body, subnet.ErrPublicIPTaken.Error()) {
			fix = "another running node advertises this node's public IP: give this node an address of its own with weftd's --public-ip or --iface"
		}
		s.r.add("weftd/ready", Fail, fix, "%s/readyz: %d %s", base, code, body)
	default:
		s.r.ok("weftd/ready", "%s/readyz: %d %s", base, code, body)
	}
	if code, body, err := s.get(ctx, base+"/metrics"); err == nil && code == 200 {
		for _, line := range strings.Split(body, "\n") {
			if rest, ok := strings.CutPrefix(line, "weft_backend_fallback{"); ok && strings.HasSuffix(line, "} 1") {
				s.fallback = strings.TrimSuffix(rest, "} 1")
			}
		}
	}
}

// checkLease finds this node's lease and its time left.
func checkLease(s *state) {
	switch {
	case s.k == nil:
		s.r.add("lease/current", Fail, fixStartWeftd, "no overlay device, so no way to tell which of the %d leases in %s is this node's", len(s.Leases), s.Source)
		return
	case s.self == nil:
		s.r.add("lease/current", Fail, "weftd has no lease in this datastore: check that weftd and weftctl use the same --etcd-endpoints and --etcd-prefix (or kubeconfig)",
			"none of the %d leases in %s matches device %s (addresses %v, local %s)", len(s.Leases), s.Source, s.k.Device.Name, s.k.Device.Addrs, s.k.Device.Local)
		return
	}
	l := s.self
	exp := l.Expiration
	switch left := exp.Sub(s.Now()); {
	case exp.IsZero():
		s.r.ok("lease/current", "subnet %s, public IP %s in %s, no TTL (Kubernetes or reserved)", l.Subnet, l.Attrs.PublicIP, s.Source)
	case left <= 0:
		s.r.add("lease/current", Fail, fixStartWeftd+": a running weftd renews its lease", "subnet %s expired %s ago", l.Subnet, (-left).Round(1e9))
	case left < 30*60*1e9:
		s.r.add("lease/current", Warn, "check weftd's log for renewal errors: it renews an hour before expiry", "subnet %s, public IP %s: only %s left", l.Subnet, l.Attrs.PublicIP, left.Round(1e9))
	default:
		s.r.ok("lease/current", "subnet %s, public IP %s in %s, %s left", l.Subnet, l.Attrs.PublicIP, s.Source, left.Round(60e9))
	}
}

// checkSubnetFile reads the subnet file and compares it with the lease,
// the network config and the overlay device.
func checkSubnetFile(s *state) {
	f, err := subnet.ReadFile(s.SubnetFile)
	if err != nil {
		s.r.add("subnetfile/present", Fail, "weftd writes it once it holds a lease: "+fixStartWeftd+"; the CNI plugin fails every ADD until it exists",
			"%v", err)
		return
	}
	s.file = &f
	fi, err := os.Stat(s.SubnetFile)
	if err == nil && fi.Mode().Perm()&0o444 != 0o444 {
		s.r.add("subnetfile/present", Warn, "chmod 0644 "+s.SubnetFile, "%s has mode %s: a plugin not run as root cannot read it", s.SubnetFile, fi.Mode().Perm())
	} else {
		s.r.ok("subnetfile/present", "%s: FLANNEL_NETWORK=%s FLANNEL_SUBNET=%s FLANNEL_MTU=%d FLANNEL_IPMASQ=%t", s.SubnetFile, f.Network, f.Subnet, f.MTU, f.IPMasq)
	}
	var bad []string
	if s.self != nil && f.Subnet != subnet.GatewayPrefix(s.self.Subnet) {
		bad = append(bad, fmt.Sprintf("FLANNEL_SUBNET %s but the lease is %s", f.Subnet, s.self.Subnet))
	}
	if s.Config != nil && f.Network != s.Config.Network {
		bad = append(bad, fmt.Sprintf("FLANNEL_NETWORK %s but the network config says %s", f.Network, s.Config.Network))
	}
	if s.k != nil && f.MTU > s.k.Device.MTU {
		bad = append(bad, fmt.Sprintf("FLANNEL_MTU %d exceeds %s's MTU %d: pods would send packets the overlay cannot carry", f.MTU, s.k.Device.Name, s.k.Device.MTU))
	}
	if len(bad) > 0 {
		s.r.add("subnetfile/matches", Fail, "restart weftd: it rewrites the subnet file from its lease (another daemon may have written this one)", "%s", strings.Join(bad, "; "))
		return
	}
	if s.self != nil {
		s.r.ok("subnetfile/matches", "matches the lease %s, the network and the overlay MTU", s.self.Subnet)
	}
}

// cniFile is one network configuration file in the runtime's directory.
type cniFile struct {
	path       string
	types      []string
	subnetFile string // of the weft plugin; "" when it has none
	err        error
}

// checkCNI finds the configuration the runtime would use (the first file
// in lexical order, as containerd and CRI-O read only that one) and checks
// that it runs weft's plugin against this subnet file.
func checkCNI(s *state) {
	if s.CNIConfDir == "" {
		return
	}
	files, err := readCNIDir(s.CNIConfDir)
	if err != nil || len(files) == 0 {
		s.r.add("cni/config", Fail, "install weft's conflist in "+s.CNIConfDir+" (see docs/install.md)", "no CNI configuration in %s (%v)", s.CNIConfDir, err)
		return
	}
	first := files[0]
	wi := slices.IndexFunc(files, func(f cniFile) bool { return slices.Contains(f.types, "weft") })
	switch {
	case first.err != nil:
		s.r.add("cni/config", Fail, "fix or remove "+first.path, "the runtime reads %s first and it does not parse: %v", first.path, first.err)
	case wi > 0:
		s.r.add("cni/config", Fail, fmt.Sprintf("rename %s so that it sorts first (for example 00-weft.conflist), or remove %s", files[wi].path, first.path),
			"the runtime reads only %s (plugins %v); weft's %s comes after it", first.path, first.types, files[wi].path)
	case wi < 0 && slices.Contains(first.types, "flannel"):
		s.r.add("cni/config", Warn, "replace it with weft's conflist when the migration is done", "%s runs Flannel's plugin, which reads the same subnet file %s", first.path, s.SubnetFile)
	case wi < 0:
		s.r.add("cni/config", Fail, "install weft's conflist so that it sorts first in "+s.CNIConfDir, "the runtime reads %s (plugins %v): no weft plugin", first.path, first.types)
	case filepath.Clean(first.subnetFile) != filepath.Clean(s.SubnetFile):
		s.r.add("cni/config", Fail, fmt.Sprintf(`set "subnetFile": %q in %s, or weftd's --subnet-file to %s`, s.SubnetFile, first.path, first.subnetFile),
			"%s reads the subnet file %s, weftd writes %s", first.path, first.subnetFile, s.SubnetFile)
	default:
		s.r.ok("cni/config", "the runtime reads %s first: plugins %v, subnet file %s", first.path, first.types, first.subnetFile)
	}
}

func readCNIDir(dir string) ([]cniFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []cniFile
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || ext != ".conf" && ext != ".conflist" && ext != ".json" {
			continue
		}
		out = append(out, parseCNIFile(filepath.Join(dir, e.Name())))
	}
	return out, nil // os.ReadDir sorts by name, as the runtimes do
}

func parseCNIFile(path string) cniFile {
	f := cniFile{path: path}
	b, err := os.ReadFile(path)
	if err != nil {
		f.err = err
		return f
	}
	var doc struct {
		Type       string            `json:"type"`
		SubnetFile string            `json:"subnetFile"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		f.err = err
		return f
	}
	confs := doc.Plugins
	if len(confs) == 0 {
		confs = []json.RawMessage{b}
	}
	for _, c := range confs {
		var p struct {
			Type       string `json:"type"`
			SubnetFile string `json:"subnetFile"`
		}
		if err := json.Unmarshal(c, &p); err != nil {
			f.err = err
			return f
		}
		f.types = append(f.types, p.Type)
		if p.Type == "weft" {
			f.subnetFile = p.SubnetFile
			if f.subnetFile == "" {
				f.subnetFile = subnet.DefaultSubnetFile
			}
		}
	}
	if len(f.types) == 0 {
		f.err = errors.New("no plugin type")
	}
	return f
}
