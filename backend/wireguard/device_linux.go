package wireguard

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// wgDevice is one WireGuard device, kernel or in-process.
type wgDevice interface {
	// Configure sets the private key and port (when key is not nil), sets
	// the peers in set (created or updated, allowed IPs replaced) and
	// removes the peers keyed in remove. Peers not named are left alone.
	Configure(c Config, key *wgtypes.Key, port int, set []Peer, remove []string) error
	// Peers returns the device's peers by public key.
	Peers() (map[string]Peer, error)
	// Close releases the device: an in-process one disappears with its
	// TUN; a kernel one stays for the next run.
	Close() error
}

// kernelSupported decides from the error of `ip link add <name> type
// wireguard` whether the kernel has WireGuard: no error, or a device of that
// name already there (kernel, from an earlier run), means yes; the errors a
// kernel without the module gives (unknown link kind) mean no; anything else
// is a real failure.
func kernelSupported(addErr error) (bool, error) {
	switch {
	case addErr == nil, errors.Is(addErr, unix.EEXIST):
		return true, nil
	case errors.Is(addErr, unix.EOPNOTSUPP), errors.Is(addErr, unix.ENOTSUP),
		errors.Is(addErr, unix.ENODEV), errors.Is(addErr, unix.EAFNOSUPPORT), errors.Is(addErr, unix.ENOENT):
		return false, nil
	}
	return false, addErr
}

// openDevice makes device name: a kernel device when want allows it and the
// kernel has WireGuard, else an in-process one on a TUN, created (and its
// sockets opened) in the namespace at nsPath ("" = the current one).
func openDevice(h *netlink.Handle, nsPath, name string, mtu int, want *bool, log *slog.Logger) (wgDevice, bool, error) {
	if want == nil || *want {
		err := h.LinkAdd(&netlink.GenericLink{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}, LinkType: "wireguard"})
		ok, err := kernelSupported(err)
		if err != nil {
			return nil, false, fmt.Errorf("create wireguard device %s: %w", name, err)
		}
		if ok {
			if l, err := h.LinkByName(name); err == nil && l.Type() == "wireguard" {
				return &kernelDevice{name: name, nsPath: nsPath}, true, nil
			}
			return nil, false, fmt.Errorf("create wireguard device %s: a link of another kind has that name", name)
		}
		if want != nil {
			return nil, false, fmt.Errorf("create wireguard device %s: the kernel has no WireGuard", name)
		}
	}
	d, err := newUserDevice(h, nsPath, name, mtu, log)
	return d, false, err
}

// inNS runs f in the namespace at path, or right here when path is "".
// A TUN or socket opened in f keeps that namespace.
func inNS(path string, f func() error) error {
	if path == "" {
		return f()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return f() })
}

// kernelDevice is a kernel WireGuard device, configured with wgctrl (whose
// generic netlink socket is opened in the device's namespace).
type kernelDevice struct{ name, nsPath string }

// client opens wgctrl in the device's namespace.
func (k *kernelDevice) client() (*wgctrl.Client, error) {
	var cl *wgctrl.Client
	err := inNS(k.nsPath, func() error {
		var err error
		cl, err = wgctrl.New()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("wgctrl: %w", err)
	}
	return cl, nil
}

func (k *kernelDevice) Configure(c Config, key *wgtypes.Key, port int, set []Peer, remove []string) error {
	cfg, err := c.kernelConfig(key, port, set, remove)
	if err != nil {
		return err
	}
	cl, err := k.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.ConfigureDevice(k.name, cfg); err != nil {
		return fmt.Errorf("configure %s: %w", k.name, err)
	}
	return nil
}

// kernelConfig is what Configure hands to the kernel.
func (c Config) kernelConfig(key *wgtypes.Key, port int, set []Peer, remove []string) (wgtypes.Config, error) {
	var cfg wgtypes.Config
	if key != nil {
		cfg.PrivateKey, cfg.ListenPort = key, &port
	}
	for _, r := range remove {
		pk, err := wgtypes.ParseKey(r)
		if err != nil {
			return cfg, fmt.Errorf("peer key %q: %w", r, err)
		}
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: pk, Remove: true})
	}
	for _, p := range set {
		pc, err := c.peerConfig(p)
		if err != nil {
			return cfg, err
		}
		cfg.Peers = append(cfg.Peers, pc)
	}
	return cfg, nil
}

func (k *kernelDevice) Peers() (map[string]Peer, error) {
	cl, err := k.client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	d, err := cl.Device(k.name)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", k.name, err)
	}
	out := map[string]Peer{}
	for _, p := range d.Peers {
		q := Peer{Key: p.PublicKey.String()}
		if t := p.LastHandshakeTime; t.Unix() != 0 {
			q.LastHandshake = t
		}
		if p.Endpoint != nil {
			q.Endpoint = p.Endpoint.AddrPort()
		}
		for _, a := range p.AllowedIPs {
			ip, _ := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			q.AllowedIPs = append(q.AllowedIPs, netip.PrefixFrom(ip.Unmap(), ones))
		}
		out[q.Key] = q
	}
	return out, nil
}

func (k *kernelDevice) Close() error { return nil }

// userDevice is WireGuard run by weftd (wireguard-go) on a TUN.
type userDevice struct {
	dev    *device.Device
	nsPath string
	log    *slog.Logger
	pub    wgtypes.Key // this node's public key, once Configure set the private one

	mu     sync.Mutex
	closed bool
	timers map[*time.Timer]struct{} // pending kickLater calls
}

// kickDelay is how long a node waits for a peer that starts the
// handshake first (kicksFirst) before starting one itself.
const kickDelay = time.Second

func newUserDevice(h *netlink.Handle, nsPath, name string, mtu int, log *slog.Logger) (*userDevice, error) {
	if l, err := h.LinkByName(name); err == nil {
		// A leftover of another kind (a kernel device of an earlier
		// kernel, a foreign link) blocks the name.
		if err := h.LinkDel(l); err != nil {
			return nil, fmt.Errorf("remove stale %s: %w", name, err)
		}
	}
	var t tun.Device
	err := inNS(nsPath, func() error {
		var err error
		t, err = tun.CreateTUN(name, mtu)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create TUN %s: %w", name, err)
	}
	lg := &device.Logger{
		Verbosef: func(string, ...any) {},
		Errorf:   func(f string, a ...any) { log.Debug("wireguard-go: "+fmt.Sprintf(f, a...), "device", name) },
	}
	return &userDevice{dev: device.NewDevice(t, conn.NewDefaultBind(), lg), nsPath: nsPath, log: log.With("device", name),
		timers: map[*time.Timer]struct{}{}}, nil
}

// Configure also starts a handshake with every peer it sets, rather than
// wait for traffic: a peer that still holds a session with this node's
// previous device (weftd restarted) would otherwise keep sending into it
// until its own timer makes it start a new handshake, about 15 s after its
// first packet that got no answer. Of two nodes only one starts at once
// (kicksFirst); the other waits kickDelay and starts one only if no
// handshake with that peer completed meanwhile (the peer does not know
// this node yet, or it kept its old session). Its persistent keepalive,
// which would start a handshake as soon as it is turned on, is turned on
// then too. When two nodes that set each other up at the same moment both
// started at once, their initiations crossed, and in TestWireGuard a ping
// between them then failed for the test's whole 10 s (at least 4 of 80
// runs).
func (u *userDevice) Configure(c Config, key *wgtypes.Key, port int, set []Peer, remove []string) error {
	if key != nil {
		u.pub = key.PublicKey()
	}
	var first, later []Peer
	for _, p := range set {
		if k, err := wgtypes.ParseKey(p.Key); err == nil && !kicksFirst(u.pub, k) {
			later = append(later, p)
		} else {
			first = append(first, p) // a bad key fails in uapi
		}
	}
	text, err := c.uapi(key, port, first, remove)
	if err != nil {
		return err
	}
	quiet := c
	quiet.Keepalive = 0
	rest, err := quiet.uapi(nil, 0, later, nil)
	if err != nil {
		return err
	}
	since := time.Now()
	// Setting the port or bringing the device up opens its UDP sockets.
	err = inNS(u.nsPath, func() error {
		if err := u.dev.IpcSet(text + rest); err != nil {
			return fmt.Errorf("configure wireguard-go: %w", err)
		}
		if err := u.dev.Up(); err != nil {
			return fmt.Errorf("wireguard-go up: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range first {
		k, _ := wgtypes.ParseKey(p.Key)
		if peer := u.dev.LookupPeer(device.NoisePublicKey(k)); peer != nil {
			peer.SendHandshakeInitiation(false)
		}
	}
	if len(later) > 0 {
		u.kickLater(c.Keepalive, later, since)
	}
	return nil
}

// kicksFirst reports whether a node with public key own starts the
// handshake with peer at once when it sets the peer up: the node with the
// lower key does, so that of two nodes only one does.
func kicksFirst(own, peer wgtypes.Key) bool {
	return bytes.Compare(own[:], peer[:]) < 0
}

// kickLater, after kickDelay, turns on the persistent keepalive of the
// peers (when keepalive is not 0; that sends a keepalive, or starts a
// handshake when there is no session) or else starts a handshake with
// each of them that completed none after since. Peers removed meanwhile
// are left alone.
func (u *userDevice) kickLater(keepalive int, peers []Peer, since time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(kickDelay, func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		delete(u.timers, t)
		if u.closed {
			return
		}
		have, err := u.Peers()
		if err != nil {
			u.log.Warn("wireguard handshakes not started", "error", err)
			return
		}
		var on strings.Builder
		for _, p := range peers {
			h, ok := have[p.Key]
			switch {
			case !ok: // removed
			case keepalive > 0:
				k, _ := wgtypes.ParseKey(p.Key)
				fmt.Fprintf(&on, "public_key=%x\nupdate_only=true\npersistent_keepalive_interval=%d\n", k[:], keepalive)
			case h.LastHandshake.Before(since):
				k, _ := wgtypes.ParseKey(p.Key)
				if peer := u.dev.LookupPeer(device.NoisePublicKey(k)); peer != nil {
					peer.SendHandshakeInitiation(false)
				}
			}
		}
		if on.Len() > 0 {
			if err := u.dev.IpcSet(on.String()); err != nil {
				u.log.Warn("wireguard persistent keepalive not turned on", "error", err)
			}
		}
	})
	u.timers[t] = struct{}{}
}

func (u *userDevice) Peers() (map[string]Peer, error) {
	text, err := u.dev.IpcGet()
	if err != nil {
		return nil, fmt.Errorf("read wireguard-go: %w", err)
	}
	return parseUAPIPeers(text)
}

func (u *userDevice) Close() error {
	u.mu.Lock()
	u.closed = true
	for t := range u.timers {
		t.Stop()
	}
	u.mu.Unlock()
	u.dev.Close()
	return nil
}

// parseUAPIPeers reads the peers of a UAPI "get" answer, with their last
// handshakes.
func parseUAPIPeers(text string) (map[string]Peer, error) {
	out := map[string]Peer{}
	var cur *Peer
	var sec, nsec int64
	flush := func() {
		if cur != nil {
			if sec != 0 || nsec != 0 {
				cur.LastHandshake = time.Unix(sec, nsec)
			}
			out[cur.Key] = *cur
		}
		sec, nsec = 0, 0
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "public_key":
			flush()
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != 32 {
				return nil, fmt.Errorf("uapi: bad public_key %q", v)
			}
			key, _ := wgtypes.NewKey(b)
			cur = &Peer{Key: key.String()}
		case "endpoint":
			if cur != nil {
				cur.Endpoint, _ = netip.ParseAddrPort(v)
			}
		case "allowed_ip":
			if p, err := netip.ParsePrefix(v); err == nil && cur != nil {
				cur.AllowedIPs = append(cur.AllowedIPs, p)
			}
		case "last_handshake_time_sec":
			sec, _ = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			nsec, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	flush()
	return out, sc.Err()
}

// RemoveDevices removes the wireguard devices (flannel-wg, flannel-wg-v6)
// in h's namespace, for a node that now runs another backend: their route
// for the whole cluster network would otherwise catch pod traffic. Missing
// devices are fine.
func RemoveDevices(h *netlink.Handle) error {
	var errs []error
	for _, name := range []string{DeviceName, DeviceNameV6} {
		l, err := h.LinkByName(name)
		if err != nil {
			continue
		}
		if err := h.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
