package uvxlan

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Receive batch shapes. With UDP GRO one buffer holds up to 64 KB of
// coalesced datagrams; without it, one datagram.
const (
	plainBatch   = 32
	plainBuf     = 1 << 16 // a tunnel-GSO super-packet from a kernel peer takes up to 64 KB
	offloadBatch = 8
	offloadBuf   = 1 << 16
)

// openSockets opens the receive sockets on the VXLAN port and the send
// sockets, each on an ephemeral port of the local port range. A UDP socket
// cannot choose its source port per datagram, so the flow hash picks a
// socket; this keeps UDP GSO usable (a raw socket would not be).
func (dp *datapath) openSockets() error {
	for q := range dp.b.cfg.Queues {
		rx, err := dp.openRx(q)
		if err != nil {
			return err
		}
		dp.rxs[q].Store(rx)
	}
	for range dp.b.cfg.SourcePorts {
		tx, err := listenUDP(netip.AddrPortFrom(dp.b.cfg.Local, 0), roleSend, false)
		if err != nil {
			return err
		}
		dp.tx = append(dp.tx, tx)
	}
	return nil
}

// openRx returns receive socket q: the one kept from the last run when it
// fits, else a new one, which is then kept for the next.
func (dp *datapath) openRx(q int) (*udpSocket, error) {
	s, adopted, err := reuseOrOpen(dp.b, dp.b.cfg.rxFileName(q), dp.adoptRx, dp.listenRx,
		func(s *udpSocket) syscall.RawConn { return s.rc })
	dp.adopted = dp.adopted || adopted
	return s, err
}

// listenRx opens one receive socket on the VXLAN port (in the calling
// thread's namespace).
func (dp *datapath) listenRx() (*udpSocket, error) {
	cfg := dp.b.cfg
	role := roleRecv
	if dp.rxGRO() {
		role = roleRecvGRO
	}
	return listenUDP(netip.AddrPortFrom(cfg.Local, uint16(cfg.Port)), role, cfg.Queues > 1)
}

// recvFailed handles a receive socket that returned an error: it is
// logged, counted as a "socket" repair and replaced by a new socket on the
// same port. It returns when a new socket is in place or the datapath
// closes.
func (dp *datapath) recvFailed(q int, old *udpSocket, err error) {
	dp.b.log.Warn("receive socket failed; reopening it", "queue", q, "err", err)
	for delay := 10 * time.Millisecond; !dp.closing.Load(); delay = min(2*delay, time.Second) {
		old.close() // frees the port for the new socket
		var s *udpSocket
		oerr := inNS(dp.b.cfg.NetNS, func() (err error) { s, err = dp.openRx(q); return err })
		if oerr == nil {
			dp.rxs[q].Store(s)
			if dp.closing.Load() { // close may have missed it
				s.close()
			}
			dp.b.ctr.socket.Add(1)
			return
		}
		dp.b.log.Error("cannot reopen the receive socket; retrying", "queue", q, "err", oerr, "in", delay)
		time.Sleep(delay)
	}
}

// txSocket picks the send socket (the outer source port) for a frame.
func (dp *datapath) txSocket(frame []byte) *udpSocket {
	return dp.tx[uint64(flowHash(frame))*uint64(len(dp.tx))>>32]
}

// maxGatherHeader is the longest header run (Ethernet, IP, TCP) that
// sendSegments gathers from its header buffer; a longer one (IPv6
// extension headers) takes the copying path.
const maxGatherHeader = 192

// segmenter is the egress state for TSO super-frames. The segments of
// consecutive super-frames read in one wake-up go out together when they
// can: a run gathers segments for one peer through one socket, all of one
// stride, and leaves in one UDP GSO send when it is full (the 64 KB
// datagram limit), when the next segment cannot join it, or when the
// wake-up's frames are done (flush). TCP hands over super-frames of up to
// 64 KB, one segment more than a send can carry, so sending each on its
// own took two sends, the second of one or two segments.
type segmenter struct {
	g    *gatherSender
	hdrs []byte                     // a VXLAN header and a header run per segment of the run
	used int                        // bytes of hdrs the run holds
	run  runKey                     // where the run goes and its stride
	nseg int                        // segments in the run
	send func(run runKey, nseg int) // sends the run gathered in g
	// noUDPGSO, when set and true, makes every run one segment (one
	// datagram per send): see Backend.noUDPGSO.
	noUDPGSO *atomic.Bool
	s        *sender
	out      []byte // room for whole segments, for the copying path
}

// runKey is what the segments of one UDP GSO send share: the socket they
// leave from (the outer source port), the peer and the stride (every
// datagram's length but the last one's).
type runKey struct {
	sock   *udpSocket
	p      *peer
	stride int
}

func newSegmenter() *segmenter {
	return &segmenter{
		g:    newGatherSender(2 * maxGSOSegments),
		hdrs: make([]byte, maxGSOSegments*(vxlanHeaderLen+maxGatherHeader)),
		s:    newSender(),
		out:  make([]byte, 2*(ethHeaderLen+maxIPPacket)),
	}
}

// sendSegments segments a TSO super-frame and adds the segments to the
// segmenter's run (pack), which sends them in as few UDP GSO sends as the
// 64 KB datagram limit allows. Each segment's headers are built in a small
// buffer and its payload is gathered from the frame where it lies (no copy
// in userspace): the frame must stay as it is until sg.flush.
func (dp *datapath) sendSegments(sg *segmenter, frame []byte, h vnetHdr) {
	p, ok := dp.b.peers.Load().byMAC[dstMAC(frame)]
	if !ok {
		dp.b.ctr.drop(DropUnknownMAC)
		return
	}
	plan, err := planTSO(frame, h)
	if err != nil {
		dp.b.ctr.drop(DropMalformed)
		return
	}
	if plan.hdrLen > maxGatherHeader {
		sg.flush() // keep the order of the segments
		dp.sendSegmentsCopied(sg, p, frame, h)
		return
	}
	sg.pack(&plan, frame, dp.b.dec.vni, runKey{sock: dp.txSocket(frame), p: p, stride: vxlanHeaderLen + plan.hdrLen + plan.mss})
}

// pack adds every segment of plan to the run for key, each as its VXLAN
// header and headers (built in sg.hdrs) followed by its payload in frame.
// The run is sent first if it goes elsewhere or has another stride, and
// after a segment that fills it or is shorter than the stride (only the
// last datagram of a UDP GSO send may be).
func (sg *segmenter) pack(plan *tsoPlan, frame []byte, vni uint32, key runKey) {
	if sg.nseg > 0 && sg.run != key {
		sg.flush()
	}
	per := min(maxUDPPayload/key.stride, maxGSOSegments)
	if sg.noUDPGSO != nil && sg.noUDPGSO.Load() {
		per = 1
	}
	slot := vxlanHeaderLen + plan.hdrLen
	for i := range plan.nseg {
		if sg.nseg == 0 {
			sg.g.reset(key.p)
			sg.run, sg.used = key, 0
		}
		hdr := sg.hdrs[sg.used : sg.used+slot]
		sg.used += slot
		putVXLANHeader(hdr, vni)
		copy(hdr[vxlanHeaderLen:], frame[:plan.hdrLen])
		chunk := plan.chunk(i)
		plan.fixHeader(hdr[vxlanHeaderLen:], chunk, i)
		sg.g.add(hdr)
		if len(chunk) > 0 {
			sg.g.add(chunk)
		}
		sg.nseg++
		if sg.nseg == per || slot+len(chunk) < key.stride {
			sg.flush()
		}
	}
}

// flush sends the run, if it holds any segment.
func (sg *segmenter) flush() {
	if sg.nseg == 0 {
		return
	}
	n := sg.nseg
	sg.nseg = 0
	sg.send(sg.run, n)
}

// sendRun is the segmenter's send: the nseg segments gathered in sg.g, as
// one UDP GSO send (a plain datagram for one).
func (dp *datapath) sendRun(sg *segmenter, run runKey, nseg int) {
	sg.g.segment(gsoSize(nseg, run.stride))
	dp.countSend(nseg, run.sock.sendGather(sg.g))
}

// sendSegmentsCopied is sendSegments for a super-frame whose headers are
// too long to gather: the segments are written whole to sg.out first.
func (dp *datapath) sendSegmentsCopied(sg *segmenter, p *peer, frame []byte, h vnetHdr) {
	stride, used, err := segmentTCP(frame, h, sg.out)
	if err != nil {
		dp.b.ctr.drop(DropMalformed)
		return
	}
	sock := dp.txSocket(frame)
	s, out := sg.s, sg.out
	per := min(maxUDPPayload/stride, maxGSOSegments)
	if dp.b.noUDPGSO.Load() {
		per = 1
	}
	for off := 0; off < used; {
		end := min(off+per*stride, used)
		for seg := off; seg < end; seg += stride {
			putVXLANHeader(out[seg:], dp.b.dec.vni)
		}
		s.buf, s.to = out[off:end], p.sa
		nseg := (end - off + stride - 1) / stride
		s.setSegment(gsoSize(nseg, stride))
		dp.countSend(nseg, sock.send(s))
		off = end
	}
}

// gsoSize is the UDP_SEGMENT size of a send of nseg segments of stride
// bytes: 0 (a plain datagram) for one.
func gsoSize(nseg, stride int) int {
	if nseg > 1 {
		return stride
	}
	return 0
}

// countSend counts n datagrams sent, or dropped when err is not nil.
func (dp *datapath) countSend(n int, err error) {
	if err != nil {
		dp.b.ctr.drops[DropSend].Add(uint64(n))
	} else {
		dp.b.ctr.tx.Add(uint64(n))
	}
}

// ingress moves datagrams from receive socket q to TAP queue q until the
// datapath closes. A failed socket is replaced (recvFailed); it never ends
// the loop. As in egress, the datagrams are handled inside the poller's
// read callback, which asks it to wait at once after a batch that was not
// full (the kernel found the queue empty).
func (dp *datapath) ingress(q int) {
	count, size := plainBatch, plainBuf
	if dp.vnet {
		count, size = offloadBatch, offloadBuf
	}
	r := newRecvBatch(count, size)
	deliver := func(b []byte, _ l4Csum) error { return dp.writeTAP(q, b) }
	var gro *coalescer
	var segOut []byte // room to cut super-packets into segments, without offloads
	tg := newTAPGather()
	if dp.vnet {
		gro = newGatherCoalescer(func(iov [][]byte) error { return dp.writeTAPv(q, tg, iov...) })
		deliver = gro.add
	} else {
		segOut = make([]byte, 2*(ethHeaderLen+maxIPPacket))
	}
	waited := true // the callback last asked the poller to wait (or the loop starts)
	wake := func(fd uintptr) bool {
		if waited {
			dp.b.ctr.loops.ingressWakes.Add(1)
		}
		defer dp.countIngressCalls(r, tg)
		waited = true
		if !r.read(fd) {
			return false // nothing queued: wait for the poller
		}
		if r.err != nil {
			waited = false
			return true
		}
		dp.receiveBatch(q, r, deliver, gro, tg, segOut)
		waited = !r.full() // the kernel found the queue empty: wait
		return !waited
	}
	for {
		sock := dp.rxs[q].Load()
		r.err = nil
		err := sock.rc.Read(wake)
		if err == nil {
			err = r.err
		}
		if err == nil {
			continue // a full batch: there is more to read
		}
		if dp.closing.Load() {
			return
		}
		dp.recvFailed(q, sock, err)
	}
}

// countIngressCalls adds the system calls the ingress loop made since the
// last count to the loop counters.
func (dp *datapath) countIngressCalls(r *recvBatch, tg *tapGather) {
	c := &dp.b.ctr.loops
	c.udpRecvs.Add(r.calls)
	c.tapWrites.Add(tg.calls)
	r.calls, tg.calls = 0, 0
}

// receiveBatch handles the datagrams of one read of receive socket q.
func (dp *datapath) receiveBatch(q int, r *recvBatch, deliver func([]byte, l4Csum) error, gro *coalescer, tg *tapGather, segOut []byte) {
	ps := dp.b.peers.Load()
	for i := range r.n {
		pkt, src, seg, trunc := r.datagram(i)
		if trunc {
			dp.b.ctr.drop(DropOversize)
			continue
		}
		if dp.b.dec.tunnelGSO(pkt) {
			if subnets, ok := ps.byAddr[src]; ok {
				dp.receiveSuper(q, pkt, seg, subnets, gro, tg, segOut)
			} else {
				dp.b.ctr.drop(DropNotPeer)
			}
			continue
		}
		dp.receive(ps, pkt, src, seg, deliver)
	}
	if gro != nil {
		gro.flush()
	}
}

// receive checks the datagrams in pkt (several of seg bytes each when UDP
// GRO coalesced them) and delivers the inner frames.
func (dp *datapath) receive(ps *peers, pkt []byte, src netip.Addr, seg int, deliver func([]byte, l4Csum) error) {
	if len(pkt) == 0 {
		dp.b.ctr.drop(DropTruncated)
		return
	}
	if seg <= 0 {
		seg = len(pkt)
	}
	subnets, ok := ps.byAddr[src]
	if !ok {
		dp.b.ctr.drops[DropNotPeer].Add(uint64((len(pkt) + seg - 1) / seg))
		return
	}
	for len(pkt) > 0 {
		d := pkt[:min(seg, len(pkt))]
		pkt = pkt[len(d):]
		frame, why := dp.b.dec.decode(d)
		var cs l4Csum
		if why == DropNone {
			cs, why = dp.checkInner(frame, subnets)
		}
		if why != DropNone {
			dp.b.ctr.drop(why)
			continue
		}
		if deliver(frame, cs) == nil {
			dp.b.ctr.rx.Add(1) // a failed write is counted by writeTAP
		}
	}
}

// checkInner applies the inner frame checks (checkInnerFrame) and counts a
// partial checksum. Without offloads the TAP cannot carry the mark, so a
// partial checksum is completed here instead.
func (dp *datapath) checkInner(frame []byte, subnets []netip.Prefix) (l4Csum, DropReason) {
	ip, class, cs, why := checkInnerFrame(frame, subnets, dp.b.cfg.AllowForeignSources)
	if why != DropNone {
		return cs, why
	}
	if class == csumPartial {
		dp.b.ctr.partialCsum.Add(1)
		if !dp.vnet {
			completePartial(frame, ip, cs)
			cs = l4Csum{}
		}
	}
	return cs, DropNone
}

// writeTAP writes one frame (with its virtio-net header when offloads are
// on) to TAP queue q. A queue whose device was deleted makes the
// reconciler open the device again.
func (dp *datapath) writeTAP(q int, b []byte) error {
	dp.b.ctr.loops.tapWrites.Add(1)
	if _, err := dp.taps[q].Load().rw.Write(b); err != nil {
		dp.b.ctr.drop(DropTAPWrite)
		if errors.Is(err, unix.EBADFD) {
			dp.lostTAP(q, err)
		}
		return err
	}
	return nil
}
