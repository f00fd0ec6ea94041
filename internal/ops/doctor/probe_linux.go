package doctor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/subnet"
)

// probeResult is what the probes found for one peer.
type probeResult struct {
	peer     subnet.Lease
	small    connectivity.Stats
	df       connectivity.Stats
	dfSize   int
	underlay connectivity.Stats
	err      error // the probe could not run
}

// checkProbes probes every peer in parallel: echo requests to its VTEP
// address (the first address of its subnet, on its overlay device), which
// only come back through both VXLAN tunnels; then one with DF set at the
// overlay MTU; and, when the overlay is silent, the peer's public IP on the
// underlay, to tell a blocked VXLAN port from a node that is down.
func checkProbes(ctx context.Context, s *state) {
	if s.k == nil {
		return
	}
	peers := s.peers()
	if len(peers) == 0 {
		s.r.ok("probe/peers", "no other node holds a lease: nothing to probe")
		return
	}
	results := make([]probeResult, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() { results[i] = s.probe(ctx, p) })
	}
	wg.Wait()
	s.probes = results
	for _, res := range results {
		s.report(res)
	}
}

func (s *state) probe(_ context.Context, p subnet.Lease) probeResult {
	res := probeResult{peer: p, dfSize: s.k.Device.MTU}
	pg, err := connectivity.NewPinger(s.Do)
	if err != nil {
		res.err = err
		return res
	}
	defer pg.Close()
	vtep := kernel.Gateway(p.Subnet)
	res.small = pg.PingN(vtep, s.Probe.Count, 84, false, s.Probe.Timeout)
	if res.small.Received == 0 {
		res.underlay = pg.PingN(p.Attrs.PublicIP, s.Probe.Count, 84, false, s.Probe.Timeout)
		return res
	}
	res.df = pg.PingN(vtep, 2, res.dfSize, true, s.Probe.Timeout)
	return res
}

func (s *state) report(res probeResult) {
	p := res.peer
	name := "probe/" + p.Attrs.PublicIP.String()
	vtep := kernel.Gateway(p.Subnet)
	port := subnet.DefaultVXLANPort
	if s.Config != nil {
		port = s.Config.Backend.Port
	}
	switch {
	case res.err != nil:
		s.r.add(name, Warn, "run weftctl doctor as root (it needs a raw ICMP socket)", "cannot probe: %v", res.err)
	case res.small.Received == 0 && res.underlay.Received > 0:
		s.r.add(name, Fail, fmt.Sprintf("allow UDP port %d between the nodes in both directions (host firewalls, security groups, the hypervisor)", port),
			"UDP %d blocked on the path: %s answers on the underlay (%s) but its VTEP %s does not answer over the overlay (%d/%d lost)",
			port, p.Attrs.PublicIP, rtt(res.underlay), vtep, res.small.Sent-res.small.Received, res.small.Sent)
	case res.small.Received == 0:
		s.r.add(name, Fail, "check that the node is up and reachable on the underlay, then run weftctl doctor on it",
			"node %s (subnet %s) answers neither over the overlay (VTEP %s) nor on the underlay: %v", p.Attrs.PublicIP, p.Subnet, vtep, res.underlay.Err)
	case res.df.Received == 0 && errors.As(res.df.Err, new(*connectivity.FragNeededError)):
		// PMTU discovery works: a hop (or this node's own device) said so.
		s.r.add(name, Fail, "lower Backend.MTU in the network config to the path's MTU (or raise the underlay's MTU) and restart weftd",
			"path MTU smaller than the overlay's, reported by the path: small probes to %s come back (%s) but a %d-byte probe with DF set is refused (%s)", vtep, rtt(res.small), res.dfSize, dfErr(res.df.Err))
	case res.df.Received == 0:
		s.r.add(name, Fail, "lower the overlay MTU: set the underlay MTU right on every node and restart weftd, or find the hop with the smaller MTU",
			"MTU black hole: small probes to %s come back (%s) but a %d-byte probe with DF set does not (%v)", vtep, rtt(res.small), res.dfSize, dfErr(res.df.Err))
	case res.small.Received < res.small.Sent:
		s.r.add(name, Warn, "check the underlay for loss (and the peer's load)",
			"VTEP %s: %d/%d lost, %s; DF %d bytes ok", vtep, res.small.Sent-res.small.Received, res.small.Sent, rtt(res.small), res.dfSize)
	default:
		s.r.ok(name, "VTEP %s of %s over the overlay: %d/%d, %s; DF %d bytes ok", vtep, p.Subnet, res.small.Received, res.small.Sent, rtt(res.small), res.dfSize)
	}
}

func rtt(st connectivity.Stats) string {
	if st.Received == 0 {
		return "no reply"
	}
	return fmt.Sprintf("rtt min/avg/max %s/%s/%s", ms(st.Min), ms(st.Avg), ms(st.Max))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }

func dfErr(err error) string {
	var fn *connectivity.FragNeededError
	if errors.As(err, &fn) {
		return fn.Error()
	}
	if err == nil {
		return "lost"
	}
	return err.Error()
}
