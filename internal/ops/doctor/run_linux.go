package doctor

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

// state is what the checks share while they run on one node.
type state struct {
	Node
	r    *Report
	k    *inspect.Kernel // nil when no overlay device was found
	self *subnet.Lease   // this node's lease; nil when none matches
	file *subnet.File    // the subnet file; nil when unreadable
	// fallback is weftd's weft_backend_fallback series (its labels), ""
	// when weftd runs the configured dataplane or its metrics are unread.
	fallback string
	fp       *fastPathRead // see fastPath; nil until read
	probes   []probeResult // what checkProbes found, one a peer
}

// Run runs every check on n and returns the report. It fails only in its
// checks: a check that cannot read what it needs says so as its evidence.
func Run(ctx context.Context, n Node) *Report {
	if n.Now == nil {
		n.Now = time.Now
	}
	if n.Probe.Count == 0 {
		n.Probe.Count = 3
	}
	if n.Probe.Timeout == 0 {
		n.Probe.Timeout = time.Second
	}
	s := &state{Node: n, r: &Report{Node: n.Name}}
	checkWeftd(ctx, s)
	s.readOverlay()
	checkLease(s)
	checkSubnetFile(s)
	checkCNI(s)
	checkKernel(s)
	checkUnderlay(s)
	checkFirewall(s)
	checkPeerFilter(s)
	checkFastPathFirewall(s)
	checkVXLANPort(s)
	checkOffload(s)
	if n.Kube != nil {
		checkKube(s)
	}
	trace := s.startInputTrace() // the probes make the peers send the datagrams it traces
	if !n.Probe.Skip {
		checkProbes(ctx, s)
	}
	checkInput(s, trace) // stops the trace
	checkForward(s, trace)
	return s.r
}

// readOverlay finds the overlay device and this node's lease.
func (s *state) readOverlay() {
	k, err := inspect.ReadKernel(s.Handle, s.Device)
	if err != nil {
		s.r.add("overlay/device", Fail, "start weftd on this node (it creates weft.<VNI>, weft-u.<VNI> with --backend uvxlan, or flannel-wg with --backend wireguard)", "%v", err)
		return
	}
	s.k = k
	up := "up"
	if !k.Device.Up {
		up = "DOWN"
	}
	ev := fmt.Sprintf("%s (%s, MTU %d, %s, addresses %v)", k.Device.Name, k.Device.Kind, k.Device.MTU, up, k.Device.Addrs)
	if !k.Device.Up {
		s.r.add("overlay/device", Fail, "ip link set "+k.Device.Name+" up (weftd brings it up on its next sync; is weftd running?)", "%s", ev)
	} else {
		s.r.ok("overlay/device", "%s", ev)
	}
	if l, ok := inspect.SelfLease(s.Leases, k); ok {
		s.self = &l
	}
}

// sysctl reads /proc/sys/<path> in the node's namespace ("" when absent).
func (s *state) sysctl(path string) (string, error) {
	var v string
	err := s.Do.Run(func() error {
		b, err := os.ReadFile("/proc/sys/" + path)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v, err
}

// procNet reads /proc/thread-self/net/<name> in the node's namespace.
func (s *state) procNet(name string) (string, error) {
	var v string
	err := s.Do.Run(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/" + name)
		v = string(b)
		return err
	})
	return v, err
}

// get fetches url with a connection opened in the node's namespace.
func (s *state) get(ctx context.Context, url string) (int, string, error) {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := s.Do.Run(func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	cl := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 3 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// peers are the leases of the other nodes.
func (s *state) peers() []subnet.Lease {
	var out []subnet.Lease
	for _, l := range s.Leases {
		if s.self == nil || l.Key() != s.self.Key() {
			out = append(out, l)
		}
	}
	return out
}
