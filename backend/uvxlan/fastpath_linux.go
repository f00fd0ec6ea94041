package uvxlan

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/weft-net/weft/vtep"
)

// fastPath is the kernel fast path of one backend (Config.FastPath): tc
// programs (bpf/fastpath.c) on the TAP's egress, on the underlay device's
// ingress and on the pod bridge's egress (bridge_linux.go), and the maps
// they read.
// The maps live as long as the Backend; Run's reconciler writes each Set's
// table into them, attaches the programs, and detaches them when Run
// returns.
type fastPath struct {
	tx    *ebpf.Map // VTEP MAC (8 bytes, zero padded) → peer IPv4 underlay address
	rx    *ebpf.Map // LPM trie: (peer underlay address, inner source) → rxFast or rxUserspace
	stats *ebpf.Map // per-CPU counters, one element of numFastCounters uint64
	ports *ebpf.Map // pod MAC (8 bytes, zero padded) → index of the pod bridge's port that holds it

	// mu orders every change of the maps: a Set's table and the
	// reconciler's route checks are applied together, under it.
	mu           sync.Mutex
	table        vtep.Table          // the latest Set's
	allowForeign bool                // Config.AllowForeignSources
	off          map[netip.Addr]bool // peers whose route leaves through another device
	txKeys       map[txKey][4]byte   // what the maps hold
	rxKeys       map[rxKey]struct{}

	unsupported error // the kernel has no tcx to attach the programs to: not tried again

	// hold, if set, runs before the maps are written: a test seam that
	// holds the writes to show that Set never waits for them.
	hold func()
	// load loads a program; nil means loadProgram. A test seam that makes
	// loading fail as a refusing verifier would.
	load func(name string, p progParams, f *fastPath) (*ebpf.Program, error)

	// Owned by the reconciler.
	params          progParams
	egress, ingress link.Link
	egProg, ingProg *ebpf.Program
	attached        bool
	brLink          link.Link // the bridge program's, or nil
	brProg          *ebpf.Program
	brIndex         int              // the pod bridge it is attached to
	portKeys        map[txKey]uint32 // what the ports map holds
}

type txKey [8]byte

// rxKey is the LPM trie key: the prefix length in bits (host order), then
// the peer's underlay address and the inner source, in network order.
type rxKey struct {
	Bits  uint32
	Outer [4]byte
	Inner [4]byte
}

// newFastPath creates the maps. It fails where the kernel or the process's
// privileges allow no BPF maps; the backend then runs without it.
func newFastPath() (_ *fastPath, err error) {
	f := &fastPath{txKeys: map[txKey][4]byte{}, rxKeys: map[rxKey]struct{}{}, portKeys: map[txKey]uint32{}}
	defer func() {
		if err != nil {
			f.closeMaps()
		}
	}()
	if f.tx, err = newFastMap(fastpathMapWeftFpTx); err != nil {
		return nil, err
	}
	if f.rx, err = newFastMap(fastpathMapWeftFpRx); err != nil {
		return nil, err
	}
	if f.stats, err = newFastMap(fastpathMapWeftFpStats); err != nil {
		return nil, err
	}
	if f.ports, err = newFastMap(fastpathMapWeftFpPorts); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *fastPath) closeMaps() {
	for _, m := range []*ebpf.Map{f.tx, f.rx, f.stats, f.ports} {
		if m != nil {
			m.Close()
		}
	}
}

// setTable makes the maps hold t's IPv4 peers, less those left out
// (setOff): each VTEP MAC's underlay address, and for each peer its subnets
// (or, with allowForeign, any inner source). It returns how many peers or
// subnets could not be written.
func (f *fastPath) setTable(t vtep.Table, allowForeign bool) (failed int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.table, f.allowForeign = t, allowForeign
	return f.applyLocked()
}

// setOff changes the peers left out, whose route does not leave through the
// underlay device, and applies the latest table again.
func (f *fastPath) setOff(off map[netip.Addr]bool) (failed int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.off = off
	return f.applyLocked()
}

// latest returns the latest table and the peers left out.
func (f *fastPath) latest() (vtep.Table, map[netip.Addr]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.table, f.off
}

// applyLocked writes f.table less f.off into the maps; f.mu is held.
func (f *fastPath) applyLocked() (failed int, err error) {
	if f.hold != nil {
		f.hold()
	}
	t, allowForeign, off := f.table, f.allowForeign, f.off
	tx := make(map[txKey][4]byte, len(t))
	rx := make(map[rxKey]struct{}, len(t))
	for pfx, v := range t {
		a := v.Addr.Unmap()
		if !a.Is4() || v.MAC.IsZero() || !pfx.Addr().Is4() || off[a] {
			continue
		}
		var k txKey
		copy(k[:], v.MAC[:])
		tx[k] = a.As4()
		rk := rxKey{Bits: 32, Outer: a.As4()}
		if !allowForeign {
			rk.Bits, rk.Inner = uint32(32+pfx.Bits()), pfx.Masked().Addr().As4()
		}
		rx[rk] = struct{}{}
	}
	var errs []error
	// New entries first, stale ones after: a peer that stays is never
	// missing from the maps in between.
	for k, a := range tx {
		if old, ok := f.txKeys[k]; ok && old == a {
			continue
		}
		if err := f.tx.Put(k, a); err != nil {
			failed++
			errs = append(errs, err)
			continue
		}
		f.txKeys[k] = a
	}
	for k := range rx {
		if _, ok := f.rxKeys[k]; ok {
			continue
		}
		if err := f.rx.Put(k, uint32(rxFast)); err != nil {
			failed++
			errs = append(errs, err)
			continue
		}
		f.rxKeys[k] = struct{}{}
	}
	for k := range f.txKeys {
		if _, ok := tx[k]; !ok {
			if err := f.tx.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
				continue
			}
			delete(f.txKeys, k)
		}
	}
	for k := range f.rxKeys {
		if _, ok := rx[k]; !ok {
			if err := f.rx.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
				continue
			}
			delete(f.rxKeys, k)
		}
	}
	if len(errs) > 0 {
		return failed, fmt.Errorf("fast path maps: %w", errs[0])
	}
	return 0, nil
}

// counters sums the per-CPU counters.
func (f *fastPath) counters() (c [numFastCounters]uint64) {
	var per [][numFastCounters]uint64
	if err := f.stats.Lookup(uint32(0), &per); err != nil {
		return c
	}
	for _, v := range per {
		for i := range c {
			c[i] += v[i]
		}
	}
	return c
}

// alive reports whether both programs are attached where they should be: a
// deleted device (or a detach by someone else) leaves a link defunct.
func (f *fastPath) alive() bool {
	if !f.attached {
		return false
	}
	for _, l := range []struct {
		link  link.Link
		index int
	}{{f.egress, f.params.tap}, {f.ingress, f.params.underlay}} {
		info, err := l.link.Info()
		if err != nil || info.TCX() == nil || int(info.TCX().Ifindex) != l.index {
			return false
		}
	}
	return true
}

// attach loads the programs for p and attaches them, in the calling
// thread's network namespace; programs attached for other parameters are
// replaced. It reports whether anything changed, and returns errLoad
// (wrapped) when the kernel refused a program: the next sync tries again.
func (f *fastPath) attach(p progParams) (bool, error) {
	if f.unsupported != nil {
		return false, f.unsupported
	}
	if f.alive() && f.params == p {
		return false, nil
	}
	f.detach()
	load := f.loadProg
	// A refusal may not last (a memory limit, a kernel or privileges that
	// change under a running weftd): the caller tries again at its next
	// sync.
	eg, err := load(fastpathProgWeftFpEgress, p)
	if err != nil {
		return false, fmt.Errorf("%w: %w", errLoad, err)
	}
	ing, err := load(fastpathProgWeftFpIngress, p)
	if err != nil {
		eg.Close()
		return false, fmt.Errorf("%w: %w", errLoad, err)
	}
	f.egProg, f.ingProg = eg, ing
	if f.egress, err = link.AttachTCX(link.TCXOptions{Interface: p.tap, Program: eg, Attach: ebpf.AttachTCXEgress}); err != nil {
		f.detach()
		err = fmt.Errorf("attach to the tap's egress: %w", err)
		if errors.Is(err, ebpf.ErrNotSupported) {
			f.unsupported = err
		}
		return false, err
	}
	if f.ingress, err = link.AttachTCX(link.TCXOptions{Interface: p.underlay, Program: ing, Attach: ebpf.AttachTCXIngress}); err != nil {
		f.detach()
		return false, fmt.Errorf("attach to the underlay's ingress: %w", err)
	}
	f.params, f.attached = p, true
	return true, nil
}

// loadProg loads the named program for p with f's maps (f.load, the test
// seam, if set).
func (f *fastPath) loadProg(name string, p progParams) (*ebpf.Program, error) {
	if f.load != nil {
		return f.load(name, p, f)
	}
	return loadProgram(name, p, f)
}

// detach removes the programs (closing a tcx link detaches it).
func (f *fastPath) detach() {
	f.detachBridge()
	if f.egress != nil {
		f.egress.Close()
	}
	if f.ingress != nil {
		f.ingress.Close()
	}
	if f.egProg != nil {
		f.egProg.Close()
	}
	if f.ingProg != nil {
		f.ingProg.Close()
	}
	f.egress, f.ingress, f.egProg, f.ingProg = nil, nil, nil, nil
	f.attached = false
}
