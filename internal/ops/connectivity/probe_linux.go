package connectivity

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/namespace"
)

// Probe is a short-lived pod: a network namespace wired by the CNI plugin
// of a node's conflist, as a container runtime wires a pod sandbox, with a
// TCP echo server inside.
type Probe struct {
	NS     *namespace.NS
	Addr   netip.Addr
	Server *TCPServer
	cni    *libcni.CNIConfig
	list   *libcni.NetworkConfigList
	rt     *libcni.RuntimeConf
}

// ProbeConfig says how to wire a probe on one node.
type ProbeConfig struct {
	Name     string   // namespace name (under /run/netns)
	Conflist string   // the node's CNI conflist
	CNIPath  []string // directories holding the plugins
	CacheDir string   // libcni's result cache for probes
	NodeDo   Do       // enters the node's namespace, where the plugins run
}

// nsExec runs each plugin from a thread in the node's namespace, so the
// plugin process lives there.
type nsExec struct {
	invoke.RawExec
	version.PluginDecoder
	do Do
}

func (e *nsExec) ExecPlugin(ctx context.Context, path string, stdin []byte, env []string) ([]byte, error) {
	var out []byte
	err := e.do.Run(func() error {
		var err error
		out, err = e.RawExec.ExecPlugin(ctx, path, stdin, env)
		return err
	})
	return out, err
}

// NewProbe creates the namespace, ADDs it through the conflist and starts
// the TCP server. On failure it removes what it made.
func NewProbe(ctx context.Context, c ProbeConfig) (*Probe, error) {
	list, err := loadConf(c.Conflist)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", c.Name, err)
	}
	ns, err := namespace.CreateNamed(c.Name)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", c.Name, err)
	}
	p := &Probe{NS: ns, list: list,
		cni: libcni.NewCNIConfigWithCacheDir(c.CNIPath, c.CacheDir, &nsExec{RawExec: invoke.RawExec{Stderr: os.Stderr}, do: c.NodeDo}),
		rt:  &libcni.RuntimeConf{ContainerID: c.Name, NetNS: ns.Path, IfName: "eth0"}}
	res, err := p.cni.AddNetworkList(ctx, list, p.rt)
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("probe %s: CNI ADD: %w", c.Name, err)
	}
	if p.Addr, err = firstIPv4(res); err != nil {
		p.Close()
		return nil, fmt.Errorf("probe %s: %w", c.Name, err)
	}
	if err := waitUp(ctx, ns, c.NodeDo); err != nil {
		p.Close()
		return nil, fmt.Errorf("probe %s: %w", c.Name, err)
	}
	if p.Server, err = ListenTCP(ns.Do, netip.AddrPortFrom(netip.IPv4Unspecified(), 0)); err != nil {
		p.Close()
		return nil, fmt.Errorf("probe %s: %w", c.Name, err)
	}
	return p, nil
}

func firstIPv4(res types.Result) (netip.Addr, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("CNI result: %w", err)
	}
	for _, ip := range r.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, errors.New("the CNI result has no IPv4 address")
}

// Endpoint is the probe as a matrix endpoint.
func (p *Probe) Endpoint(name string) Endpoint {
	return Endpoint{Name: name, Addr: p.Addr, TCPPort: p.Server.Addr().Port(), Do: p.NS.Do}
}

// Close stops the server, DELs the probe through the plugin (which frees
// its address) and deletes the namespace.
func (p *Probe) Close() error {
	var errs []error
	if p.Server != nil {
		errs = append(errs, p.Server.Close())
	}
	errs = append(errs, p.cni.DelNetworkList(context.Background(), p.list, p.rt))
	p.NS.Handle.Close()
	errs = append(errs, namespace.DeleteNamed(p.NS.Name))
	return errors.Join(errs...)
}

// waitUp waits until the probe's eth0 and its host end are operationally
// up: the kernel activates a new link's queue only then (up to a second
// after the plugin set it up), and drops what is sent before.
func waitUp(ctx context.Context, ns *namespace.NS, nodeDo Do) error {
	var host *netlink.Handle
	err := nodeDo.Run(func() error {
		var err error
		host, err = netlink.NewHandle()
		return err
	})
	if err != nil {
		return fmt.Errorf("netlink in the node: %w", err)
	}
	defer host.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		l, err := ns.Handle.LinkByName("eth0")
		if err == nil && l.Attrs().OperState == netlink.OperUp {
			peer, err := host.LinkByIndex(l.Attrs().ParentIndex)
			if err == nil && peer.Attrs().OperState == netlink.OperUp {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("eth0 and its host end not up: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// loadConf reads a .conflist, or a single-plugin .conf/.json as a list:
// runtimes still read those, so a probe must be wired from one too.
func loadConf(path string) (*libcni.NetworkConfigList, error) {
	if filepath.Ext(path) == ".conflist" {
		return libcni.NetworkConfFromFile(path)
	}
	//lint:ignore SA1019 containerd and CRI-O still read single-plugin files
	conf, err := libcni.ConfFromFile(path)
	if err != nil {
		return nil, err
	}
	//lint:ignore SA1019 as above
	return libcni.ConfListFromConf(conf)
}
