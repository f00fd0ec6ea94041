package uvxlan

import (
	"fmt"
	"io"
	"net/netip"
)

// Receive batch shapes. With UDP GRO one buffer holds up to 64 KB of
// coalesced datagrams; without it, one datagram.
const (
	plainBatch   = 64
	plainBuf     = 16 << 10
	offloadBatch = 8
	offloadBuf   = 1 << 16
)

// openSockets opens the receive socket on the VXLAN port and the send
// sockets, each on an ephemeral port of the local port range. A UDP socket
// cannot choose its source port per datagram, so the flow hash picks a
// socket; this keeps UDP GSO usable (a raw socket would not be).
func (dp *datapath) openSockets() error {
	cfg := dp.b.cfg
	role := roleRecv
	if dp.vnet {
		role = roleRecvGRO
	}
	for range cfg.Queues {
		rx, err := listenUDP(netip.AddrPortFrom(cfg.Local, uint16(cfg.Port)), role, cfg.Queues > 1)
		if err != nil {
			return err
		}
		dp.rxs = append(dp.rxs, rx)
	}
	for range cfg.SourcePorts {
		tx, err := listenUDP(netip.AddrPortFrom(cfg.Local, 0), roleSend, false)
		if err != nil {
			return err
		}
		dp.tx = append(dp.tx, tx)
	}
	return nil
}

// txSocket picks the send socket (the outer source port) for a frame.
func (dp *datapath) txSocket(frame []byte) *udpSocket {
	return dp.tx[uint64(flowHash(frame))*uint64(len(dp.tx))>>32]
}

// sendSegments segments a TSO super-frame and sends the segments to its
// peer in as few UDP GSO sends as the 64 KB datagram limit allows.
func (dp *datapath) sendSegments(s *sender, frame []byte, h vnetHdr, out []byte) {
	p, ok := dp.b.peers.Load().byMAC[dstMAC(frame)]
	if !ok {
		dp.b.ctr.drop(DropUnknownMAC)
		return
	}
	stride, used, err := segmentTCP(frame, h, out)
	if err != nil {
		dp.b.ctr.drop(DropMalformed)
		return
	}
	sock := dp.txSocket(frame)
	per := min(maxUDPPayload/stride, maxGSOSegments)
	for off := 0; off < used; {
		end := min(off+per*stride, used)
		for seg := off; seg < end; seg += stride {
			putVXLANHeader(out[seg:], dp.b.dec.vni)
		}
		s.buf, s.to = out[off:end], p.sa
		nseg := (end - off + stride - 1) / stride
		if nseg > 1 {
			s.setSegment(stride)
		} else {
			s.setSegment(0)
		}
		if err := sock.send(s); err != nil {
			dp.b.ctr.drops[DropSend].Add(uint64(nseg))
		} else {
			dp.b.ctr.tx.Add(uint64(nseg))
		}
		off = end
	}
}

// ingress moves datagrams from receive socket q to TAP queue q until the
// socket is closed.
func (dp *datapath) ingress(q int) error {
	count, size := plainBatch, plainBuf
	if dp.vnet {
		count, size = offloadBatch, offloadBuf
	}
	r := newRecvBatch(count, size)
	tap := dp.taps[q]
	deliver := func(b []byte) error { return dp.writeTAP(tap, b) }
	var gro *coalescer
	if dp.vnet {
		gro = newCoalescer(deliver)
		deliver = func(b []byte) error { return gro.add(b, l4Csum{}) }
	}
	for {
		n, err := dp.rxs[q].recv(r)
		if err != nil {
			if dp.closing.Load() {
				return nil
			}
			return fmt.Errorf("receive: %w", err)
		}
		ps := dp.b.peers.Load()
		for i := range n {
			pkt, src, seg, trunc := r.datagram(i)
			if trunc {
				dp.b.ctr.drop(DropOversize)
				continue
			}
			dp.receive(ps, pkt, src, seg, deliver)
		}
		if gro != nil {
			gro.flush()
		}
	}
}

// receive checks the datagrams in pkt (several of seg bytes each when UDP
// GRO coalesced them) and delivers the inner frames.
func (dp *datapath) receive(ps *peers, pkt []byte, src netip.Addr, seg int, deliver func([]byte) error) {
	if len(pkt) == 0 {
		dp.b.ctr.drop(DropTruncated)
		return
	}
	if seg <= 0 {
		seg = len(pkt)
	}
	if _, ok := ps.byAddr[src]; !ok {
		dp.b.ctr.drops[DropNotPeer].Add(uint64((len(pkt) + seg - 1) / seg))
		return
	}
	for len(pkt) > 0 {
		d := pkt[:min(seg, len(pkt))]
		pkt = pkt[len(d):]
		frame, why := dp.b.dec.decode(d)
		if why != DropNone {
			dp.b.ctr.drop(why)
			continue
		}
		if deliver(frame) == nil {
			dp.b.ctr.rx.Add(1) // a failed write is counted by writeTAP
		}
	}
}

// writeTAP writes one frame (with its virtio-net header when offloads are on).
func (dp *datapath) writeTAP(tap io.Writer, b []byte) error {
	if _, err := tap.Write(b); err != nil {
		dp.b.ctr.drop(DropTAPWrite)
		return err
	}
	return nil
}
