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
	bufs [][]byte
	lens []int
	at   int // where in each buffer the read lands
	n    int
	err  error
	fn   func(fd uintptr) bool
}

func newTAPBatch(count, size, at int) *tapBatch {
	b := &tapBatch{bufs: make([][]byte, count), lens: make([]int, count), at: at}
	for i := range b.bufs {
		b.bufs[i] = make([]byte, size)
	}
	b.fn = b.read
	return b
}

func (b *tapBatch) read(fd uintptr) bool {
	b.n, b.err = 0, nil
	for b.n < len(b.bufs) {
		n, err := unix.Read(int(fd), b.bufs[b.n][b.at:])
		switch err {
		case nil:
			b.lens[b.n] = n
			b.n++
			continue
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			b.err = err
		}
		break
	}
	return b.n > 0 || b.err != nil
}

// frame returns read i with the room in front of it.
func (b *tapBatch) frame(i int) []byte { return b.bufs[i][:b.at+b.lens[i]] }

// egress moves frames from TAP queue q to the peers until the datapath
// closes. Plain frames are queued and leave in one sendmmsg per socket run;
// TSO super-frames are segmented and leave with UDP GSO (sendSegments). A
// queue whose device was deleted is reported (lostTAP) and the loop waits
// for the reconciler to open the device again.
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
	}
	for {
		t := dp.taps[q].Load()
		err := t.rc.Read(tb.fn)
		if err == nil {
			err = tb.err
		}
		for i := range tb.n {
			if dp.vnet {
				dp.egressOffloaded(sb, sg, tb.frame(i))
			} else {
				dp.queue(sb, tb.frame(i))
			}
		}
		dp.flush(sb)
		if err != nil {
			if dp.closing.Load() {
				return
			}
			dp.lostTAP(q, err)
			if !dp.waitTAP(q, t) {
				return
			}
		}
	}
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
