package uvxlan

import (
	"encoding/binary"
	"errors"
)

// The virtio-net header that a TAP opened with IFF_VNET_HDR puts in front of
// every frame (struct virtio_net_hdr, little endian, 10 bytes). On a TAP,
// csumStart and hdrLen count from the start of the Ethernet header.
const (
	virtioNetHdrLen   = 10
	vnetFlagNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	vnetGSONone       = 0
	vnetGSOTCPv4      = 1
	vnetGSOTCPv6      = 4
	vnetGSOECN        = 0x80
	tcpFlagFIN        = 0x01
	tcpFlagSYN        = 0x02
	tcpFlagRST        = 0x04
	tcpFlagPSH        = 0x08
	tcpFlagACK        = 0x10
	tcpFlagURG        = 0x20
	tcpFlagCWR        = 0x80
	maxIPPacket       = 65535
	maxUDPPayload     = 65535 - 40 - 8 // what one UDP GSO send may carry
	maxGSOSegments    = 64
	ipv4HeaderLenMin  = 20
	ipv6HeaderLen     = 40
	tcpHeaderLenMin   = 20
)

type vnetHdr struct {
	flags      uint8
	gsoType    uint8
	hdrLen     uint16
	gsoSize    uint16
	csumStart  uint16
	csumOffset uint16
}

func decodeVnetHdr(b []byte) vnetHdr {
	_ = b[9]
	return vnetHdr{
		flags: b[0], gsoType: b[1],
		hdrLen:     binary.LittleEndian.Uint16(b[2:]),
		gsoSize:    binary.LittleEndian.Uint16(b[4:]),
		csumStart:  binary.LittleEndian.Uint16(b[6:]),
		csumOffset: binary.LittleEndian.Uint16(b[8:]),
	}
}

func (h vnetHdr) encode(b []byte) {
	_ = b[9]
	b[0], b[1] = h.flags, h.gsoType
	binary.LittleEndian.PutUint16(b[2:], h.hdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.gsoSize)
	binary.LittleEndian.PutUint16(b[6:], h.csumStart)
	binary.LittleEndian.PutUint16(b[8:], h.csumOffset)
}

var errBadOffload = errors.New("bad offload header")

// completeChecksum finishes a partial checksum as a NIC would: the sum of
// frame[start:] (whose checksum field holds the pseudo-header sum) goes,
// complemented, into frame[start+offset:].
func completeChecksum(frame []byte, start, offset int) error {
	at := start + offset
	if start >= len(frame) || at+2 > len(frame) {
		return errBadOffload
	}
	binary.BigEndian.PutUint16(frame[at:], ^checksumFold(checksumAdd(frame[start:], 0)))
	return nil
}

// tsoLayout checks the offload header of a TSO super-frame against the
// frame and returns where its TCP header starts, the length of all its
// headers (recomputed: the header's hdr_len is only a hint) and the MSS.
func tsoLayout(frame []byte, h vnetHdr) (v6 bool, tcpOff, hdrLen, mss int, err error) {
	if len(frame) < ethHeaderLen+ipv4HeaderLenMin {
		return false, 0, 0, 0, errBadOffload
	}
	v6 = h.gsoType&^vnetGSOECN == vnetGSOTCPv6
	et := binary.BigEndian.Uint16(frame[12:])
	if v6 != (et == etherTypeIPv6) || (!v6 && et != etherTypeIPv4) {
		return false, 0, 0, 0, errBadOffload
	}
	tcpOff = int(h.csumStart)
	if !v6 && (frame[ethHeaderLen]>>4 != 4 || frame[ethHeaderLen]&0x0f < 5) {
		return false, 0, 0, 0, errBadOffload // not IPv4, or a header shorter than 20 bytes
	}
	if !v6 && tcpOff != ethHeaderLen+int(frame[ethHeaderLen]&0x0f)*4 || v6 && tcpOff < ethHeaderLen+ipv6HeaderLen {
		return false, 0, 0, 0, errBadOffload
	}
	if tcpOff+tcpHeaderLenMin > len(frame) || h.csumOffset != 16 {
		return false, 0, 0, 0, errBadOffload
	}
	hdrLen = tcpOff + int(frame[tcpOff+12]>>4)*4
	mss = int(h.gsoSize)
	if hdrLen > len(frame) || hdrLen < tcpOff+tcpHeaderLenMin || mss == 0 {
		return false, 0, 0, 0, errBadOffload
	}
	return v6, tcpOff, hdrLen, mss, nil
}

// tsoPlan is how a TSO super-frame from the TAP is cut into frames that
// fit the overlay MTU: segment i carries payload[i*mss:] (at most mss
// bytes) behind a copy of the super-frame's hdrLen bytes of headers, which
// fixHeader adjusts.
type tsoPlan struct {
	v6                  bool
	tcpOff, hdrLen, mss int
	nseg                int
	payload             []byte
	seq                 uint32
	flags               byte
	ipID                uint16
	pseudo              uint64 // the pseudo-header sum without the length
}

func planTSO(frame []byte, h vnetHdr) (tsoPlan, error) {
	v6, tcpOff, hdrLen, mss, err := tsoLayout(frame, h)
	if err != nil {
		return tsoPlan{}, err
	}
	p := tsoPlan{v6: v6, tcpOff: tcpOff, hdrLen: hdrLen, mss: mss, payload: frame[hdrLen:],
		seq: binary.BigEndian.Uint32(frame[tcpOff+4:]), flags: frame[tcpOff+13]}
	p.nseg = max(1, (len(p.payload)+mss-1)/mss)
	addrOff, addrLen := ethHeaderLen+12, 4
	if v6 {
		addrOff, addrLen = ethHeaderLen+8, 16
	} else {
		p.ipID = binary.BigEndian.Uint16(frame[ethHeaderLen+4:])
	}
	p.pseudo = checksumAdd(frame[addrOff:addrOff+2*addrLen], 0) + 6 // src, dst, protocol
	return p, nil
}

// chunk is the payload of segment i.
func (p *tsoPlan) chunk(i int) []byte {
	return p.payload[min(i*p.mss, len(p.payload)):min((i+1)*p.mss, len(p.payload))]
}

// fixHeader turns hdr, a copy of the super-frame's headers, into the
// headers of segment i, whose payload is chunk: its own IPv4 length, ID
// and header checksum (IPv6 payload length), TCP sequence number and a
// complete TCP checksum; FIN and PSH stay on the last segment only, CWR on
// the first only.
func (p *tsoPlan) fixHeader(hdr, chunk []byte, i int) {
	ip := hdr[ethHeaderLen:]
	n := p.hdrLen + len(chunk) // the frame's length
	if p.v6 {
		binary.BigEndian.PutUint16(ip[4:], uint16(n-ethHeaderLen-ipv6HeaderLen))
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(n-ethHeaderLen))
		binary.BigEndian.PutUint16(ip[4:], p.ipID+uint16(i))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^checksumFold(checksumAdd(ip[:p.tcpOff-ethHeaderLen], 0)))
	}
	tcp := hdr[p.tcpOff:p.hdrLen]
	binary.BigEndian.PutUint32(tcp[4:], p.seq+uint32(i*p.mss))
	f := p.flags
	if i != p.nseg-1 {
		f &^= tcpFlagFIN | tcpFlagPSH
	}
	if i != 0 {
		f &^= tcpFlagCWR
	}
	tcp[13] = f
	tcp[16], tcp[17] = 0, 0
	// The TCP header is a whole number of 32-bit words: its sum and the
	// payload's add up to the sum of the segment.
	sum := checksumAdd(chunk, checksumAdd(tcp, p.pseudo+uint64(len(tcp)+len(chunk))))
	binary.BigEndian.PutUint16(tcp[16:], ^checksumFold(sum))
}

// segmentTCP cuts a TSO super-frame from the TAP into frames that fit the
// overlay MTU, each written whole to out behind room for a VXLAN header
// (tsoPlan). It returns the stride of the segments in out (VXLAN header +
// full frame; the last may be shorter) and the bytes used.
func segmentTCP(frame []byte, h vnetHdr, out []byte) (stride, used int, err error) {
	p, err := planTSO(frame, h)
	if err != nil {
		return 0, 0, err
	}
	stride = vxlanHeaderLen + p.hdrLen + p.mss
	if vxlanHeaderLen*p.nseg+p.hdrLen*p.nseg+len(p.payload) > len(out) {
		return 0, 0, errBadOffload
	}
	for i := range p.nseg {
		chunk := p.chunk(i)
		seg := out[used+vxlanHeaderLen : used+vxlanHeaderLen+p.hdrLen+len(chunk)]
		copy(seg, frame[:p.hdrLen])
		copy(seg[p.hdrLen:], chunk)
		p.fixHeader(seg[:p.hdrLen], chunk, i)
		used += vxlanHeaderLen + len(seg)
	}
	return stride, used, nil
}
