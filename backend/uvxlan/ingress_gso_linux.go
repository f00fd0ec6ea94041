package uvxlan

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// receiveSuper delivers a tunnel-GSO super-packet (decoder.tunnelGSO): its
// inner TCP super-segment, after the same checks as any inner frame, goes
// to the TAP as one GSO frame when the TAP takes offloads, as the kernel's
// own VXLAN receive path would hand it on; otherwise it is cut here into
// segments that fit the pods' MTU, with complete checksums. seg is the
// sender's segment size when the kernel reported one (UDP GRO control
// message), else 0. tg writes to the TAP; out is scratch room for the segments (plain TAP only).
func (dp *datapath) receiveSuper(q int, pkt []byte, seg int, subnets []netip.Prefix, gro *coalescer, tg *tapGather, out []byte) {
	frame, why := dp.b.dec.decodeAnySize(pkt)
	var ip innerIP
	var class csumClass
	if why == DropNone {
		ip, class, _, why = checkInnerFrame(frame, subnets, dp.b.cfg.AllowForeignSources)
	}
	if why == DropNone && (ip.proto != protoTCP || ip.fragged || ip.l4Len < tcpHeaderLenMin) {
		why = DropOversize // only TCP super-segments are taken
	}
	if why != DropNone {
		dp.b.ctr.drop(why)
		return
	}
	if class == csumPartial {
		dp.b.ctr.partialCsum.Add(1)
	}
	h, nseg, ok := superHeader(frame, ip, dp.b.cfg.PodMTU, seg)
	if !ok {
		dp.b.ctr.drop(DropInnerMalformed)
		return
	}
	if !dp.vnet {
		dp.writeSegments(q, frame, h, out)
		return
	}
	if gro != nil {
		gro.flush() // what the coalescer holds was received first
	}
	var hdr [virtioNetHdrLen]byte
	h.encode(hdr[:])
	if dp.writeTAPv(q, tg, hdr[:], frame) == nil {
		dp.b.ctr.rx.Add(uint64(nseg))
	}
}

// superHeader returns the virtio-net GSO header for a TCP super-segment
// (frame, whose IP layer is ip) and how many segments it stands for, and
// puts the pseudo-header sum into its checksum field, as NEEDS_CSUM wants.
// The segment size is the sender's (seg) when it fits mtu (the pods'),
// else the largest that does: the kernel forwards no segment larger than
// the pods' MTU to them.
func superHeader(frame []byte, ip innerIP, mtu, seg int) (vnetHdr, int, bool) {
	hdrLen := ip.l4 + int(frame[ip.l4+12]>>4)*4
	if hdrLen < ip.l4+tcpHeaderLenMin || hdrLen >= len(frame) {
		return vnetHdr{}, 0, false
	}
	mss := mtu - (hdrLen - ethHeaderLen)
	if seg > 0 && seg < mss {
		mss = seg
	}
	if mss <= 0 {
		return vnetHdr{}, 0, false
	}
	h := vnetHdr{flags: vnetFlagNeedsCsum, gsoType: vnetGSOTCPv4, hdrLen: uint16(hdrLen), gsoSize: uint16(mss),
		csumStart: uint16(ip.l4), csumOffset: 16}
	if ip.addrLen == 16 {
		h.gsoType = vnetGSOTCPv6
	}
	pseudo := checksumAdd(frame[ip.addrOff:ip.addrOff+2*ip.addrLen], uint64(protoTCP)+uint64(ip.l4Len))
	binary.BigEndian.PutUint16(frame[ip.l4+16:], checksumFold(pseudo))
	payload := len(frame) - hdrLen
	return h, (payload + mss - 1) / mss, true
}

// writeSegments cuts a super-segment into frames of h's segment size (see
// superHeader) and writes each to TAP queue q (no offloads: complete checksums).
func (dp *datapath) writeSegments(q int, frame []byte, h vnetHdr, out []byte) {
	stride, used, err := segmentTCP(frame, h, out)
	if err != nil {
		dp.b.ctr.drop(DropInnerMalformed)
		return
	}
	for off := 0; off < used; off += stride {
		if dp.writeTAP(q, out[off+vxlanHeaderLen:min(off+stride, used)]) == nil {
			dp.b.ctr.rx.Add(1)
		}
	}
}

// tapGather is a reusable writev(2) of one frame to a TAP queue, gathered
// from several pieces (the coalescer's gather lists).
type tapGather struct {
	iovs  []unix.Iovec
	n     int
	err   error
	fn    func(fd uintptr) bool
	calls uint64 // system calls made, for the loop counters
}

func newTAPGather() *tapGather {
	g := &tapGather{iovs: make([]unix.Iovec, 2+maxGSOSegments)}
	g.fn = g.write
	return g
}

func (g *tapGather) write(fd uintptr) bool {
	g.calls++
	_, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&g.iovs[0])), uintptr(g.n))
	return syscallDone(e, &g.err)
}

// writeTAPv writes one frame, gathered from iov (empty pieces are
// skipped), to TAP queue q in one writev: the pieces need not be copied
// together first.
func (dp *datapath) writeTAPv(q int, g *tapGather, iov ...[]byte) error {
	g.n = 0
	for _, p := range iov {
		if len(p) == 0 {
			continue
		}
		if g.n == len(g.iovs) {
			dp.b.ctr.drop(DropTAPWrite)
			return errFrameTooLong
		}
		g.iovs[g.n].Base = &p[0]
		g.iovs[g.n].SetLen(len(p))
		g.n++
	}
	err := dp.taps[q].Load().rc.Write(g.fn)
	if err == nil {
		err = g.err
	}
	if err != nil {
		dp.b.ctr.drop(DropTAPWrite)
		if errors.Is(err, unix.EBADFD) {
			dp.lostTAP(q, err)
		}
	}
	return err
}
