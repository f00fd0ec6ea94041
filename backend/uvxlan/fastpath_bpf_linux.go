package uvxlan

// The fast path's programs are C (bpf/fastpath.c), compiled by bpf2go into
// the committed fastpath_bpfel.o and fastpath_bpfeb.o and their Go
// bindings, so that building weft needs no C compiler. Regenerate them
// with `go generate ./backend/uvxlan/...` (clang, llvm-strip and libbpf's
// headers: test/setup.sh installs them); TestFastPathObjectsCurrent fails
// when the committed ones differ from what the source compiles to.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux fastpath bpf/fastpath.c -- -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu -mcpu=v3 -Wall -Werror

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/weft-net/weft/subnet"
)

// Counter slots of the per-CPU stats array's one element (the enum in
// bpf/fastpath.c).
const (
	fastTxFrames = iota
	fastTxBytes
	fastRxFrames
	fastRxBytes
	fastErrors       // a frame dropped after its headers were changed (cannot be handed on)
	fastDemoted      // rx entries whose packets the ingress program handed to the userspace path for good
	fastBridgePassed // super-packets the bridge program sent to a pod's port past the bridge
	numFastCounters
)

// Values of the rx map: the peer's packets take the fast path, or (set by
// the ingress program) the userspace path.
const (
	rxFast      = 1
	rxUserspace = 2
)

// encapLen is what VXLAN over IPv4 puts in front of the inner frame after
// the outer Ethernet header: IPv4, UDP, VXLAN and the inner Ethernet header.
const encapLen = ipv4HeaderLenMin + udpHeaderLen + vxlanHeaderLen + ethHeaderLen

// progParams are the per-node values of one datapath's programs, the
// volatile const variables of bpf/fastpath.c.
type progParams struct {
	local    netip.Addr // IPv4 underlay address
	vni      int
	port     int
	mac      subnet.MAC // our VTEP MAC (the TAP's)
	mtu      int        // overlay MTU
	tap      int        // TAP ifindex
	underlay int        // ifindex of the device that holds local
}

// variables returns p as the values of the programs' variables, or an
// error for a value they cannot hold.
func (p progParams) variables() (map[string]any, error) {
	switch {
	case !p.local.Is4():
		return nil, fmt.Errorf("fast path: local address %s is not IPv4", p.local)
	case p.vni < 0 || p.vni >= 1<<24:
		return nil, fmt.Errorf("fast path: VNI %d out of range", p.vni)
	case p.port <= 0 || p.port > 0xffff:
		return nil, fmt.Errorf("fast path: port %d out of range", p.port)
	case p.mtu < ipv4HeaderLenMin+tcpHeaderLenMin || p.mtu > 0xffff:
		return nil, fmt.Errorf("fast path: MTU %d out of range", p.mtu)
	case p.tap <= 0 || p.underlay <= 0:
		return nil, fmt.Errorf("fast path: interface indexes %d (tap), %d (underlay) must be positive", p.tap, p.underlay)
	}
	return map[string]any{
		fastpathVarLocalAddr:       p.local.As4(),
		fastpathVarVni:             uint32(p.vni),
		fastpathVarPort:            uint16(p.port),
		fastpathVarVtepMac:         [6]byte(p.mac),
		fastpathVarMtu:             uint32(p.mtu),
		fastpathVarTapIfindex:      uint32(p.tap),
		fastpathVarUnderlayIfindex: uint32(p.underlay),
	}, nil
}

// newFastMap creates the named map of bpf/fastpath.c, empty.
func newFastMap(name string) (*ebpf.Map, error) {
	spec, err := loadFastpath()
	if err != nil {
		return nil, err
	}
	ms, ok := spec.Maps[name]
	if !ok {
		return nil, fmt.Errorf("fast path object has no map %q", name)
	}
	m, err := ebpf.NewMap(ms)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", name, err)
	}
	return m, nil
}

// loadProgram loads the named program of bpf/fastpath.c with p's values,
// using f's maps.
func loadProgram(name string, p progParams, f *fastPath) (*ebpf.Program, error) {
	vars, err := p.variables()
	if err != nil {
		return nil, err
	}
	spec, err := loadFastpath()
	if err != nil {
		return nil, err
	}
	if _, ok := spec.Programs[name]; !ok {
		return nil, fmt.Errorf("fast path object has no program %q", name)
	}
	for n := range spec.Programs {
		if n != name {
			delete(spec.Programs, n)
		}
	}
	for n, v := range vars {
		vs, ok := spec.Variables[n]
		if !ok {
			return nil, fmt.Errorf("fast path object has no variable %q", n)
		}
		if err := vs.Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", n, err)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		fastpathMapWeftFpTx: f.tx, fastpathMapWeftFpRx: f.rx, fastpathMapWeftFpStats: f.stats,
		fastpathMapWeftFpPorts: f.ports,
	}})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	defer coll.Close()
	return coll.DetachProgram(name), nil
}
