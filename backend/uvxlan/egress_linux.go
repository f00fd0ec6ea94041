package uvxlan

import (
	"golang.org/x/sys/unix"
)

// Egress batch shapes: how many frames one wake-up may read from the TAP.
// With offloads a frame may be a 64 KB super-frame.
const (
	egressPlainBatch   = 64
	egressOffloadBatch = 16
)

// tapBatch reads, per wake-up, every frame the TAP holds (up to its size),
// so that the frames can leave in one sendmmsg.
type tapBatch struct {
	bufs    [][]byte
	lens    []int
	at      int // where in each buffer the read lands
	n       int
	drained bool // the last read found the queue empty (EAGAIN)
	err     error
	calls   uint64 // system calls made, for the loop counters
}

func newTAPBatch(count, size, at int) *tapBatch {
	b := &tapBatch{bufs: make([][]byte, count), lens: make([]int, count), at: at}
	for i := range b.bufs {
		b.bufs[i] = make([]byte, size)
	}
	return b
}

// read reads frames from fd until the batch is full, the queue is empty
// (drained) or a read fails (err).
func (b *tapBatch) read(fd uintptr) {
	b.n, b.err, b.drained = 0, nil, false
	for b.n < len(b.bufs) {
		b.calls++
		n, err := unix.Read(int(fd), b.bufs[b.n][b.at:])
		switch err {
		case nil:
			b.lens[b.n] = n
			b.n++
			continue
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			b.drained = true
		default:
			b.err = err
		}
		return
	}
}

// frame returns read i with the room in front of it.
func (b *tapBatch) frame(i int) []byte { return b.bufs[i][:b.at+b.lens[i]] }

// egress moves frames from TAP queue q to the peers until the datapath
// closes. Plain frames are queued and leave in one sendmmsg per socket run;
// TSO super-frames are segmented and leave with UDP GSO (sendSegments). A
// queue whose device was deleted is reported (lostTAP) and the loop waits
// for the reconciler to open the device again.
//
// The frames are handled inside the poller's read callback (wake): after a
// batch whose last read found the queue empty (EAGAIN) it asks the poller
// to wait at once, so a wake-up costs one read that finds nothing, not
// two. (Returning from the callback would cost another: the next
// RawConn.Read forgets a readiness the poller saw in between, so it must
// begin with a read.) After a full batch it returns, and the next read
// finds frames.
func (dp *datapath) egress(q int) {
	at, count := vxlanHeaderLen, egressPlainBatch
	if dp.vnet {
		at, count = 0, egressOffloadBatch
	}
	tb := newTAPBatch(count, vxlanHeaderLen+virtioNetHdrLen+ethHeaderLen+maxIPPacket, at)
	sb := newSendBatch(count)
	var sg *segmenter
	if dp.vnet {
		sg = newSegmenter()
		sg.send = func(run runKey, nseg int) { dp.sendRun(sg, run, nseg) }
		sg.noUDPGSO = &dp.b.noUDPGSO
	}
	waited := true // the callback last asked the poller to wait (or the loop starts)
	wake := func(fd uintptr) bool {
		if waited {
			dp.b.ctr.loops.egressWakes.Add(1)
		}
		tb.read(fd)
		for i := range tb.n {
			if dp.vnet {
				dp.egressOffloaded(sb, sg, tb.frame(i))
			} else {
				dp.queue(sb, tb.frame(i))
			}
		}
		if sg != nil {
			sg.flush() // before the next read reuses the buffers
		}
		dp.flush(sb)
		dp.countEgressCalls(tb, sb, sg)
		waited = tb.drained && tb.err == nil // wait for the poller
		return !waited
	}
	for {
		t := dp.taps[q].Load()
		err := t.rc.Read(wake)
		if err == nil {
			err = tb.err
		}
		if err == nil {
			continue // a full batch: there is more to read
		}
		if dp.closing.Load() {
			return
		}
		if dp.taps[q].Load() == t { // else the reconciler replaced it, and closed this one
			dp.lostTAP(q, err)
		}
		if !dp.waitTAP(q, t) {
			return
		}
	}
}

// countEgressCalls adds the system calls the egress loop made since the
// last count to the loop counters.
func (dp *datapath) countEgressCalls(tb *tapBatch, sb *sendBatch, sg *segmenter) {
	c := &dp.b.ctr.loops
	c.tapReads.Add(tb.calls)
	sends := sb.calls
	if sg != nil {
		sends += sg.g.calls + sg.s.calls
		sg.g.calls, sg.s.calls = 0, 0
	}
	c.udpSends.Add(sends)
	tb.calls, sb.calls = 0, 0
}

// egressOffloaded handles one read of a TAP with a virtio-net header.
func (dp *datapath) egressOffloaded(sb *sendBatch, sg *segmenter, in []byte) {
	if len(in) < virtioNetHdrLen+ethHeaderLen {
		dp.b.ctr.drop(DropMalformed)
		return
	}
	h := decodeVnetHdr(in)
	frame := in[virtioNetHdrLen:]
	switch h.gsoType &^ vnetGSOECN {
	case vnetGSONone:
		if h.flags&vnetFlagNeedsCsum != 0 && completeChecksum(frame, int(h.csumStart), int(h.csumOffset)) != nil {
			dp.b.ctr.drop(DropMalformed)
			return
		}
		sg.flush() // keep the order of the frames
		// The VXLAN header goes over the end of the decoded virtio-net header.
		dp.queue(sb, in[virtioNetHdrLen-vxlanHeaderLen:])
	case vnetGSOTCPv4, vnetGSOTCPv6:
		dp.flush(sb) // keep the order of the frames
		dp.sendSegments(sg, frame, h)
	default:
		dp.b.ctr.drop(DropMalformed)
	}
}

// queue encapsulates the frame in pkt[vxlanHeaderLen:] and queues it.
func (dp *datapath) queue(sb *sendBatch, pkt []byte) {
	frame := pkt[vxlanHeaderLen:]
	if len(frame) < ethHeaderLen {
		dp.b.ctr.drop(DropMalformed)
		return
	}
	p, ok := dp.b.peers.Load().byMAC[dstMAC(frame)]
	if !ok {
		dp.b.ctr.drop(DropUnknownMAC)
		return
	}
	putVXLANHeader(pkt, dp.b.dec.vni)
	sock := dp.txSocket(frame)
	if sb.n > 0 && (sb.sock != sock || sb.full()) {
		dp.flush(sb)
	}
	sb.sock = sock
	sb.add(pkt, p)
}

// flush sends what queue queued.
func (dp *datapath) flush(sb *sendBatch) {
	n := sb.n
	sent, _ := sb.flush()
	dp.b.ctr.tx.Add(uint64(sent))
	if sent < n {
		dp.b.ctr.drops[DropSend].Add(uint64(n - sent))
	}
}
