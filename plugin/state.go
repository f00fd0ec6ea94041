package plugin

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/weft-net/weft/subnet"
)

// Flannel's plugin keeps, per pod, the configuration it handed to its
// delegate at <dataDir>/<containerID> (dataDir defaults to
// /var/lib/cni/flannel), and its DEL runs the delegate's DEL with that
// file; without the file its DEL does nothing and the pod's address stays
// reserved. So weft, installed as "flannel", writes the same file on ADD
// (what Flannel would have handed the bridge plugin for this pod) and
// removes it on DEL and GC: a node rolled back to Flannel frees the pods
// weft wired.

// flannelState is the delegate configuration Flannel's plugin would write
// for stdin (the flannel entry) and subnet file f: the entry's delegate
// keys; name; type bridge, ipMasq the opposite of FLANNEL_IPMASQ, mtu
// FLANNEL_MTU, isGateway true (for bridge) where unset; the network's
// cniVersion; the entry's runtimeConfig; as ipam the entry's ipam section
// with type host-local unless set, the node subnet of each family as its
// ranges and its routes followed by one to each cluster network.
func flannelState(stdin []byte, f subnet.File) ([]byte, error) {
	var n struct {
		Name          string         `json:"name"`
		CNIVersion    string         `json:"cniVersion"`
		IPAM          map[string]any `json:"ipam"`
		Delegate      map[string]any `json:"delegate"`
		RuntimeConfig map[string]any `json:"runtimeConfig"`
	}
	if err := json.Unmarshal(stdin, &n); err != nil {
		return nil, fmt.Errorf("flannel state: %w", err)
	}
	d := n.Delegate
	if d == nil {
		d = map[string]any{}
	}
	if n.RuntimeConfig != nil {
		d["runtimeConfig"] = n.RuntimeConfig
	}
	d["name"] = n.Name
	unset := func(k string, v any) {
		if _, ok := d[k]; !ok {
			d[k] = v
		}
	}
	unset("type", "bridge")
	unset("ipMasq", !f.IPMasq)
	unset("mtu", f.MTU)
	if d["type"] == "bridge" {
		unset("isGateway", true)
	}
	if n.CNIVersion != "" {
		d["cniVersion"] = n.CNIVersion
	}
	ipam := n.IPAM
	if ipam == nil {
		ipam = map[string]any{}
	}
	if _, ok := ipam["type"]; !ok {
		ipam["type"] = "host-local"
	}
	ranges := [][]map[string]string{}
	routes := []types.Route{}
	if r, ok := ipam["routes"]; ok {
		b, _ := json.Marshal(r)
		if err := json.Unmarshal(b, &routes); err != nil {
			return nil, fmt.Errorf("flannel state: ipam routes: %w", err)
		}
	}
	for _, p := range [][2]netip.Prefix{{f.Network, f.Subnet}, {f.IPv6Network, f.IPv6Subnet}} {
		if p[1].IsValid() {
			ranges = append(ranges, []map[string]string{{"subnet": p[1].Masked().String()}})
		}
	}
	for _, nw := range []netip.Prefix{f.Network, f.IPv6Network} {
		if nw.IsValid() {
			routes = append(routes, types.Route{Dst: prefixNet(nw.Masked())})
		}
	}
	ipam["ranges"], ipam["routes"] = ranges, routes
	d["ipam"] = ipam
	return json.Marshal(d)
}

// writeState writes Flannel's state file of containerID in dir as Flannel
// does (dir 0700, file 0600, synced).
func writeState(dir, containerID string, b []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("flannel state: %w", err)
	}
	fl, err := os.OpenFile(filepath.Join(dir, containerID), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("flannel state: %w", err)
	}
	_, err = fl.Write(b)
	if err == nil {
		err = fl.Sync()
	}
	if cerr := fl.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("flannel state: %w", err)
	}
	return nil
}

// removeState removes Flannel's state file of containerID in dir, if any
// (also one Flannel's plugin wrote: the pod is gone either way).
func removeState(dir, containerID string) error {
	if dir == "" {
		return nil
	}
	if err := os.Remove(filepath.Join(dir, containerID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("flannel state: %w", err)
	}
	return nil
}

// readResolvConf reads a resolv.conf as host-local's resolvConf key does:
// nameserver, domain, search and options lines.
func readResolvConf(path string) (types.DNS, error) {
	fl, err := os.Open(path)
	if err != nil {
		return types.DNS{}, fmt.Errorf("ipam resolvConf: %w", err)
	}
	defer fl.Close()
	return parseResolvConf(fl)
}

func parseResolvConf(r io.Reader) (types.DNS, error) {
	var dns types.DNS
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") || strings.HasPrefix(f[0], ";") {
			continue
		}
		switch f[0] {
		case "nameserver":
			dns.Nameservers = append(dns.Nameservers, f[1])
		case "domain":
			dns.Domain = f[1]
		case "search":
			dns.Search = append(dns.Search, f[1:]...)
		case "options":
			dns.Options = append(dns.Options, f[1:]...)
		}
	}
	if err := sc.Err(); err != nil {
		return dns, fmt.Errorf("ipam resolvConf: %w", err)
	}
	return dns, nil
}
