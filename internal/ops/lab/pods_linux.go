package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/weft-net/weft/internal/namespace"
)

// NetworkName is the name in the lab's conflist.
const NetworkName = "weft-lab"

// pod is one pod namespace attached through the plugin.
type pod struct {
	ns    *namespace.NS
	state *PodState
	rt    *libcni.RuntimeConf
}

// nsExec is a libcni executor that starts every plugin inside a node
// namespace: the fork happens on an OS thread switched into it, so the
// plugin process lives there, as it would on a real node.
type nsExec struct {
	invoke.RawExec
	version.PluginDecoder
	ns *namespace.NS
}

func (e *nsExec) ExecPlugin(ctx context.Context, path string, stdin []byte, env []string) ([]byte, error) {
	var out []byte
	err := e.ns.Do(func() error {
		var err error
		out, err = e.RawExec.ExecPlugin(ctx, path, stdin, env)
		return err
	})
	return out, err
}

// Conflist returns the lab's network configuration list for a node, as a
// runtime would read it from /etc/cni/net.d. The plugin's files stay under
// dataDir: it is also the ipam dataDir, so the address store is
// dataDir/<NetworkName>.
func Conflist(subnetFile, dataDir string) ([]byte, error) {
	return json.Marshal(map[string]any{
		"cniVersion":  "1.0.0",
		"cniVersions": []string{"1.0.0", "1.1.0"},
		"name":        NetworkName,
		"plugins": []any{map[string]any{"type": "weft", "subnetFile": subnetFile, "dataDir": dataDir,
			"ipam": map[string]any{"dataDir": dataDir}}},
	})
}

// cni returns the libcni config and conflist for node n.
func (l *Lab) cni(n *node) (*libcni.CNIConfig, *libcni.NetworkConfigList, error) {
	dir := filepath.Dir(n.state.SubnetFile)
	b, err := Conflist(n.state.SubnetFile, filepath.Join(dir, "cni"))
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "10-weft-lab.conflist"), b, 0o644); err != nil {
		return nil, nil, fmt.Errorf("write conflist: %w", err)
	}
	list, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		return nil, nil, fmt.Errorf("conflist: %w", err)
	}
	exec := &nsExec{RawExec: invoke.RawExec{Stderr: os.Stderr}, ns: n.ns}
	return libcni.NewCNIConfigWithCacheDir([]string{l.opts.CNIBin}, filepath.Join(dir, "cni-cache"), exec), list, nil
}

// addPods creates the pod namespaces and ADDs each as eth0.
func (l *Lab) addPods(ctx context.Context) error {
	for i, n := range l.nodes {
		cfg, list, err := l.cni(n)
		if err != nil {
			return err
		}
		for j := 1; j <= l.opts.PodsPerNode; j++ {
			pns, err := l.newNS(PodName(i+1, j))
			if err != nil {
				return err
			}
			l.State.Pods = append(l.State.Pods, PodState{Name: PodName(i+1, j), Node: n.state.Name, NS: pns.Name})
			ps := &l.State.Pods[len(l.State.Pods)-1]
			p := &pod{ns: pns, state: ps, rt: &libcni.RuntimeConf{ContainerID: pns.Name, NetNS: pns.Path, IfName: "eth0"}}
			n.pods = append(n.pods, p)
			res, err := cfg.AddNetworkList(ctx, list, p.rt)
			if err != nil {
				return fmt.Errorf("CNI ADD %s: %w", ps.Name, err)
			}
			if ps.IP, err = firstIP(res); err != nil {
				return fmt.Errorf("CNI ADD %s: %w", ps.Name, err)
			}
		}
	}
	// Pointers into State.Pods were taken while appending; re-point them.
	k := 0
	for _, n := range l.nodes {
		for _, p := range n.pods {
			p.state = &l.State.Pods[k]
			k++
		}
	}
	return l.save()
}

func firstIP(res types.Result) (netip.Addr, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(r.IPs) == 0 {
		return netip.Addr{}, errors.New("result has no IP")
	}
	a, ok := netip.AddrFromSlice(r.IPs[0].Address.IP)
	if !ok {
		return netip.Addr{}, fmt.Errorf("result IP %v", r.IPs[0].Address.IP)
	}
	return a.Unmap(), nil
}

// delPods DELs every pod through the plugin, as a runtime does when it
// removes a sandbox (libcni hands the plugin the cached ADD result).
func (l *Lab) delPods(ctx context.Context) error {
	var errs []error
	for _, n := range l.nodes {
		if len(n.pods) == 0 {
			continue
		}
		cfg, list, err := l.cni(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, p := range n.pods {
			if err := cfg.DelNetworkList(ctx, list, p.rt); err != nil {
				errs = append(errs, fmt.Errorf("CNI DEL %s: %w", p.ns.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
