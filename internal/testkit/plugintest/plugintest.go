// Package plugintest runs weft's CNI plugin the way a container runtime
// does, through libcni, with the "node" being a test network namespace:
// every plugin process starts inside that namespace, pods are namespaces of
// their own. Tests of other packages use it to put pods on test nodes.
package plugintest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// NSExec is a libcni executor that starts every plugin inside a namespace.
// The fork happens on an OS thread switched into it, so the plugin and all
// its threads live there.
type NSExec struct {
	invoke.RawExec
	version.PluginDecoder
	NS *nettest.NS
}

// ExecPlugin runs the plugin inside e.NS.
func (e *NSExec) ExecPlugin(ctx context.Context, path string, stdin []byte, env []string) ([]byte, error) {
	var out []byte
	err := e.NS.Do(func() error {
		var err error
		out, err = e.RawExec.ExecPlugin(ctx, path, stdin, env)
		return err
	})
	return out, err
}

// Node runs a conflist on a node namespace.
type Node struct {
	NS   *nettest.NS
	CNI  *libcni.CNIConfig
	List *libcni.NetworkConfigList
}

// Options describe the conflist; zero values take the plugin's defaults
// except DataDir, which defaults to a test temporary directory.
type Options struct {
	Name       string // network name, default "weft"
	CNIVersion string // default "1.1.0"
	DataDir    string // dataDir and ipam.dataDir: the address store is DataDir/<Name>
	Bridge     string
	MTU        int
	Portmap    string         // directory holding the reference portmap plugin: chain it after weft
	Extra      map[string]any // more keys for weft's entry (e.g. "dns", "hairpinMode")
}

// NewNode prepares a conflist of weft (and portmap when opts.Portmap is
// set) on node, reading subnetFile. weftBin is the plugin binary.
func NewNode(tb testing.TB, node *nettest.NS, weftBin, subnetFile string, opts Options) *Node {
	tb.Helper()
	if opts.Name == "" {
		opts.Name = "weft"
	}
	if opts.CNIVersion == "" {
		opts.CNIVersion = "1.1.0"
	}
	if opts.DataDir == "" {
		opts.DataDir = tb.TempDir()
	}
	weft := map[string]any{"type": "weft", "subnetFile": subnetFile, "dataDir": opts.DataDir, "ipam": map[string]any{"dataDir": opts.DataDir}}
	for k, v := range opts.Extra {
		weft[k] = v
	}
	if opts.Bridge != "" {
		weft["bridge"] = opts.Bridge
	}
	if opts.MTU != 0 {
		weft["mtu"] = opts.MTU
	}
	plugins := []any{weft}
	paths := []string{filepath.Dir(weftBin)}
	if opts.Portmap != "" {
		plugins = append(plugins, map[string]any{"type": "portmap", "backend": "nftables", "capabilities": map[string]bool{"portMappings": true}})
		paths = append(paths, opts.Portmap)
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": opts.CNIVersion, "name": opts.Name, "plugins": plugins})
	list, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		tb.Fatalf("conflist: %v", err)
	}
	cni := libcni.NewCNIConfigWithCacheDir(paths, tb.TempDir(), &NSExec{RawExec: invoke.RawExec{Stderr: os.Stderr}, NS: node})
	return &Node{NS: node, CNI: cni, List: list}
}

// Pod is a pod namespace attached by ADD.
type Pod struct {
	NS     *nettest.NS
	ID     string
	IP     netip.Addr // first address of the result
	Result *current.Result
	RT     *libcni.RuntimeConf
}

// AddPod creates a pod namespace and ADDs it as eth0; DEL runs at cleanup.
// Port mappings, if any, are passed as the portMappings capability.
func (n *Node) AddPod(tb testing.TB, label string, portMappings ...map[string]any) *Pod {
	tb.Helper()
	p, err := n.Add(nettest.NewNS(tb, label), "pod-"+label, portMappings...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Del(p); err != nil {
			tb.Errorf("DEL %s: %v", p.ID, err)
		}
	})
	return p
}

// Add ADDs podNS as eth0 with container ID id and returns the pod.
func (n *Node) Add(podNS *nettest.NS, id string, portMappings ...map[string]any) (*Pod, error) {
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: podNS.Path, IfName: "eth0"}
	if len(portMappings) > 0 {
		rt.CapabilityArgs = map[string]any{"portMappings": portMappings}
	}
	res, err := n.CNI.AddNetworkList(context.Background(), n.List, rt)
	if err != nil {
		return nil, fmt.Errorf("ADD %s: %w", id, err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("ADD %s: result: %w", id, err)
	}
	p := &Pod{NS: podNS, ID: id, Result: cur, RT: rt}
	if len(cur.IPs) > 0 {
		p.IP, _ = netip.AddrFromSlice(cur.IPs[0].Address.IP.To4())
		if !p.IP.IsValid() {
			p.IP, _ = netip.AddrFromSlice(cur.IPs[0].Address.IP)
		}
	}
	return p, nil
}

// Check runs CHECK for p.
func (n *Node) Check(p *Pod) error {
	return n.CNI.CheckNetworkList(context.Background(), n.List, p.RT)
}

// Del runs DEL for p (libcni passes the stored result).
func (n *Node) Del(p *Pod) error {
	return n.CNI.DelNetworkList(context.Background(), n.List, p.RT)
}

var (
	nodesMu sync.Mutex
	nodes   = map[*nettest.NS]*Node{}
)

// AddPod is the one-call form for multi-node tests: it ADDs a new pod
// namespace on node through weft (one Node per node namespace, made on
// first use and shared by later calls so that they share the address
// store) and returns the pod's namespace and first address. DEL runs when
// the calling test ends; the shared Node lives until the test that made it
// ends.
func AddPod(tb testing.TB, node *nettest.NS, weftBin, subnetFile, label string) (*nettest.NS, netip.Addr) {
	tb.Helper()
	nodesMu.Lock()
	n, ok := nodes[node]
	if !ok {
		n = NewNode(tb, node, weftBin, subnetFile, Options{})
		nodes[node] = n
		tb.Cleanup(func() {
			nodesMu.Lock()
			delete(nodes, node)
			nodesMu.Unlock()
		})
	}
	nodesMu.Unlock()
	p := n.AddPod(tb, label)
	return p.NS, p.IP
}
