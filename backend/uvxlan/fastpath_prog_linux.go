package uvxlan

import (
	"encoding/binary"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// The fast path's two tc programs, written with cilium/ebpf's assembler so
// that building weft needs no C compiler. Each is generated for one
// datapath: the local address, VNI, port, VTEP MAC, MTU and interface
// indexes are immediates, the peers are in maps. Anything a program does
// not fully check it passes on unchanged, to the next tcx program or else
// the kernel's usual path: the TAP queue or the UDP socket of the userspace
// path, which applies every rule and counts every drop.

// struct __sk_buff offsets (linux/bpf.h).
const (
	skbLen         = 0
	skbPktType     = 4
	skbProtocol    = 16
	skbVLANPresent = 20
	skbGSOSize     = 176
)

// tc return codes and helper flags (linux/pkt_cls.h, linux/bpf.h).
const (
	tcxNext   = -1 // TC_ACT_UNSPEC: the next tcx program, or on as if none ran
	tcActShot = 2

	adjRoomMAC      = 1
	adjFixedGSO     = 1 << 0
	adjEncapL3IPv4  = 1 << 1
	adjEncapL4UDP   = 1 << 4
	adjEncapL2Eth   = 1 << 6
	adjEncapL2Shift = 56

	redirectIngress = 1
)

// be16 and be32 return the value whose load or store in the host's byte
// order matches v's bytes in network order: what a BPF load of packet
// bytes compares with.
func be16(v uint16) int32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return int32(binary.NativeEndian.Uint16(b[:]))
}

func be32(v uint32) int32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return int32(binary.NativeEndian.Uint32(b[:]))
}

func addr4(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

// countInsns adds 1 to counter slot and, unless bytes is R0, the value of
// bytes to the slot after it, then goes on at next; it uses R0-R2 and fp-4.
func countInsns(stats *ebpf.Map, slot int, bytes asm.Register, next string) asm.Instructions {
	insns := asm.Instructions{
		asm.StoreImm(asm.R10, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, stats.FD()),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, next),
		asm.LoadMem(asm.R1, asm.R0, int16(slot*8), asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, int16(slot*8), asm.R1, asm.DWord),
	}
	if bytes != asm.R0 {
		insns = append(insns,
			asm.LoadMem(asm.R1, asm.R0, int16(slot*8+8), asm.DWord),
			asm.Add.Reg(asm.R1, bytes),
			asm.StoreMem(asm.R0, int16(slot*8+8), asm.R1, asm.DWord),
		)
	}
	return insns
}

// errorInsns counts an error and drops the frame (its headers are half
// changed, so it cannot be handed on), and holds the "pass" exit.
func errorInsns(stats *ebpf.Map) asm.Instructions {
	insns := countInsns(stats, fastErrors, asm.R0, "shot")
	insns[0] = insns[0].WithSymbol("error")
	return append(insns,
		asm.Mov.Imm(asm.R0, tcActShot).WithSymbol("shot"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("pass"),
		asm.Return(),
	)
}

// headerSumInsns leaves in R0 the folded 16-bit sum of the 20-byte IPv4
// header at fp+off (0xffff for a header with a correct checksum); it uses
// R0-R5.
func headerSumInsns(off int16) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm(asm.R1, 0),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.R10),
		asm.Add.Imm(asm.R3, int32(off)),
		asm.Mov.Imm(asm.R4, ipv4HeaderLenMin),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnCsumDiff.Call(),
		asm.Mov.Reg(asm.R2, asm.R0),
		asm.RSh.Imm(asm.R2, 16),
		asm.And.Imm(asm.R0, 0xffff),
		asm.Add.Reg(asm.R0, asm.R2),
		asm.Mov.Reg(asm.R2, asm.R0),
		asm.RSh.Imm(asm.R2, 16),
		asm.And.Imm(asm.R0, 0xffff),
		asm.Add.Reg(asm.R0, asm.R2),
	}
}

// egressProgram runs on the TAP's egress, before the frame would be queued
// for the userspace path: an IPv4 frame whose destination MAC is a peer's
// VTEP MAC (the tx map) is encapsulated in place, RFC 7348 over UDP, and
// sent out of the underlay device through the kernel's neighbour table. A
// TSO super-frame stays one: the kernel segments it as it does its own
// VXLAN's, or hands it across a virtual link whole.
//
// Stack: the 64 bytes of new headers at fp-66 (outer Ethernet fp-66, outer
// IPv4 fp-52, UDP fp-32, VXLAN fp-24, inner Ethernet fp-16, loaded from the
// frame), the map key at fp-72, the counter key at fp-4 (after use of the
// inner Ethernet copy).
func egressProgram(p progParams, tx, stats *ebpf.Map) asm.Instructions {
	const (
		hdr    = -66
		ip     = -52
		udp    = -32
		vx     = -24
		inner  = -16
		keyOff = -72
	)
	R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 := asm.R0, asm.R1, asm.R2, asm.R3, asm.R4, asm.R5, asm.R6, asm.R7, asm.R8, asm.R9, asm.R10
	flags := int64(adjFixedGSO|adjEncapL3IPv4|adjEncapL4UDP|adjEncapL2Eth) | int64(ethHeaderLen)<<adjEncapL2Shift
	insns := asm.Instructions{
		asm.Mov.Reg(R6, R1),
		asm.LoadMem(R2, R6, skbProtocol, asm.Word),
		asm.JNE.Imm(R2, be16(etherTypeIPv4), "pass"),
		asm.LoadMem(R8, R6, skbLen, asm.Word),
		asm.JGT.Imm(R8, 0xffff-(ipv4HeaderLenMin+udpHeaderLen+vxlanHeaderLen), "pass"), // the outer length must fit
		// The frame's Ethernet header becomes the inner one.
		asm.Mov.Reg(R1, R6),
		asm.Mov.Imm(R2, 0),
		asm.Mov.Reg(R3, R10),
		asm.Add.Imm(R3, inner),
		asm.Mov.Imm(R4, ethHeaderLen),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(R0, 0, "pass"),
		// tx[destination MAC] is the peer's underlay address.
		asm.StoreImm(R10, keyOff, 0, asm.Word),
		asm.StoreImm(R10, keyOff+4, 0, asm.Word),
		asm.LoadMem(R2, R10, inner, asm.Word),
		asm.StoreMem(R10, keyOff, R2, asm.Word),
		asm.LoadMem(R2, R10, inner+4, asm.Half),
		asm.StoreMem(R10, keyOff+4, R2, asm.Half),
		asm.LoadMapPtr(R1, tx.FD()),
		asm.Mov.Reg(R2, R10),
		asm.Add.Imm(R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(R0, 0, "pass"),
		asm.LoadMem(R7, R0, 0, asm.Word),
		// Source port from the inner flow's hash, in 32768–60999 as the
		// kernel's VXLAN picks it (network order in R9).
		asm.Mov.Reg(R1, R6),
		asm.FnGetHashRecalc.Call(),
		asm.Mov.Reg32(R9, R0),
		asm.Mul.Imm(R9, 60999-32768+1),
		asm.RSh.Imm(R9, 32),
		asm.Add.Imm(R9, 32768),
		asm.HostTo(asm.BE, R9, asm.Half),
		// Room for the headers, marked as a UDP tunnel with an Ethernet
		// inner frame so that GSO segments it as VXLAN; the MSS stays.
		asm.Mov.Reg(R1, R6),
		asm.Mov.Imm(R2, encapLen),
		asm.Mov.Imm(R3, adjRoomMAC),
		asm.LoadImm(R4, flags, asm.DWord),
		asm.FnSkbAdjustRoom.Call(),
		asm.JNE.Imm(R0, 0, "pass"), // unchanged on failure
		// Outer Ethernet: the MACs are filled in by the neighbour output.
		asm.StoreImm(R10, hdr, 0, asm.Half),
		asm.StoreImm(R10, hdr+2, 0, asm.Word),
		asm.StoreImm(R10, hdr+6, 0, asm.Word),
		asm.StoreImm(R10, hdr+10, 0, asm.Half),
		asm.StoreImm(R10, hdr+12, int64(be16(etherTypeIPv4)), asm.Half),
		// Outer IPv4: no DF and a random ID, as the kernel's VXLAN by
		// default; TTL 64.
		asm.FnGetPrandomU32.Call(),
		asm.StoreMem(R10, ip+4, R0, asm.Half),
		asm.StoreImm(R10, ip, int64(be16(0x4500)), asm.Half),
		asm.Mov.Reg(R2, R8),
		asm.Add.Imm(R2, ipv4HeaderLenMin+udpHeaderLen+vxlanHeaderLen),
		asm.HostTo(asm.BE, R2, asm.Half),
		asm.StoreMem(R10, ip+2, R2, asm.Half),
		asm.StoreImm(R10, ip+6, 0, asm.Half),
		asm.StoreImm(R10, ip+8, int64(be16(64<<8|17)), asm.Half),
		asm.StoreImm(R10, ip+10, 0, asm.Half),
		asm.StoreImm(R10, ip+12, int64(be32(addr4(p.local))), asm.Word),
		asm.StoreMem(R10, ip+16, R7, asm.Word),
		// UDP, checksum 0 as the kernel's VXLAN sends it over IPv4.
		asm.StoreMem(R10, udp, R9, asm.Half),
		asm.StoreImm(R10, udp+2, int64(be16(uint16(p.port))), asm.Half),
		asm.Mov.Reg(R2, R8),
		asm.Add.Imm(R2, udpHeaderLen+vxlanHeaderLen),
		asm.HostTo(asm.BE, R2, asm.Half),
		asm.StoreMem(R10, udp+4, R2, asm.Half),
		asm.StoreImm(R10, udp+6, 0, asm.Half),
		// VXLAN: the I flag and our VNI.
		asm.StoreImm(R10, vx, int64(be32(vxlanFlagI<<24)), asm.Word),
		asm.StoreImm(R10, vx+4, int64(be32(uint32(p.vni)<<8)), asm.Word),
		// The outer IPv4 header checksum.
	}
	insns = append(insns, headerSumInsns(ip)...)
	insns = append(insns,
		asm.Xor.Imm(R0, 0xffff),
		asm.StoreMem(R10, ip+10, R0, asm.Half),
		asm.Mov.Reg(R1, R6),
		asm.Mov.Imm(R2, 0),
		asm.Mov.Reg(R3, R10),
		asm.Add.Imm(R3, hdr),
		asm.Mov.Imm(R4, ethHeaderLen+encapLen),
		asm.Mov.Imm(R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(R0, 0, "error"),
	)
	insns = append(insns, countInsns(stats, fastTxFrames, R8, "send")...)
	insns = append(insns,
		asm.Mov.Imm(R1, int32(p.underlay)).WithSymbol("send"),
		asm.Mov.Imm(R2, 0),
		asm.Mov.Imm(R3, 0),
		asm.Mov.Imm(R4, 0),
		asm.FnRedirectNeigh.Call(),
		asm.Return(),
	)
	return append(insns, errorInsns(stats)...)
}

// ingressProgram runs on the underlay device's ingress, before the packet
// reaches the UDP socket: a VXLAN packet for us from a peer, whose inner
// IPv4 source is inside that peer's subnets (the rx map), is decapsulated
// in place and handed to the TAP's receive path, as if the userspace path
// had written it. Everything else goes on to the socket unchanged: packets
// for other hosts or VLANs, with IP options, fragments or a bad header
// checksum, other VNIs, flags or MACs, inner frames that are not IPv4 or
// too big, from foreign sources, and skbs whose lengths do not match one
// datagram. An skb that holds several (a super-packet of UDP datagrams: a
// peer without the fast path sends with UDP GSO, which a virtual link
// carries whole) can only be taken apart by the userspace path; from then
// on that peer's packets all go there (its rx entry says so), so that
// none of its flows' single datagrams overtakes a super-packet queued
// there. The outer UDP checksum is not checked: the inner packet's own are,
// by the receiving stack.
//
// Stack: the first 84 bytes at fp-90 (outer Ethernet fp-90, outer IPv4
// fp-76, UDP fp-56, VXLAN fp-48, inner Ethernet fp-40, inner IPv4 fp-26),
// the LPM key at fp-104, the counter key at fp-4.
func ingressProgram(p progParams, rx, stats *ebpf.Map) asm.Instructions {
	const (
		buf    = -90
		ip     = -76
		udp    = -56
		vx     = -48
		inner  = -40
		iip    = -26
		keyOff = -104
	)
	R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 := asm.R0, asm.R1, asm.R2, asm.R3, asm.R4, asm.R5, asm.R6, asm.R7, asm.R8, asm.R9, asm.R10
	m := p.mac
	insns := asm.Instructions{
		asm.Mov.Reg(R6, R1),
		asm.LoadMem(R2, R6, skbProtocol, asm.Word),
		asm.JNE.Imm(R2, be16(etherTypeIPv4), "pass"),
		asm.LoadMem(R2, R6, skbPktType, asm.Word),
		asm.JNE.Imm(R2, 0, "pass"), // PACKET_HOST only
		asm.LoadMem(R2, R6, skbVLANPresent, asm.Word),
		asm.JNE.Imm(R2, 0, "pass"), // a tagged frame is its VLAN device's
		asm.Mov.Reg(R1, R6),
		asm.Mov.Imm(R2, 0),
		asm.Mov.Reg(R3, R10),
		asm.Add.Imm(R3, buf),
		asm.Mov.Imm(R4, ethHeaderLen+encapLen+ipv4HeaderLenMin),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(R0, 0, "pass"),
		// Outer IPv4 without options or fragmentation, UDP, to us.
		asm.LoadMem(R2, R10, ip, asm.Byte),
		asm.JNE.Imm(R2, 0x45, "pass"),
		asm.LoadMem(R2, R10, ip+9, asm.Byte),
		asm.JNE.Imm(R2, 17, "pass"),
		asm.LoadMem(R2, R10, ip+6, asm.Half),
		asm.And.Imm(R2, be16(0x3fff)),
		asm.JNE.Imm(R2, 0, "pass"),
		asm.LoadMem(R2, R10, ip+16, asm.Word),
		asm.JNE.Imm32(R2, be32(addr4(p.local)), "pass"),
		asm.LoadMem(R2, R10, udp+2, asm.Half),
		asm.JNE.Imm(R2, be16(uint16(p.port)), "pass"),
		// VXLAN: exactly the I flag, our VNI.
		asm.LoadMem(R2, R10, vx, asm.Word),
		asm.JNE.Imm32(R2, be32(vxlanFlagI<<24), "pass"),
		asm.LoadMem(R2, R10, vx+4, asm.Word),
		asm.JNE.Imm32(R2, be32(uint32(p.vni)<<8), "pass"),
		// Inner Ethernet to our VTEP MAC, carrying IPv4.
		asm.LoadMem(R2, R10, inner, asm.Word),
		asm.JNE.Imm32(R2, be32(binary.BigEndian.Uint32(m[0:4])), "pass"),
		asm.LoadMem(R2, R10, inner+4, asm.Half),
		asm.JNE.Imm(R2, be16(binary.BigEndian.Uint16(m[4:6])), "pass"),
		asm.LoadMem(R2, R10, inner+12, asm.Half),
		asm.JNE.Imm(R2, be16(etherTypeIPv4), "pass"),
		asm.LoadMem(R2, R10, iip, asm.Byte),
		asm.RSh.Imm(R2, 4),
		asm.JNE.Imm(R2, 4, "pass"),
		asm.LoadMem(R2, R10, iip, asm.Byte),
		asm.And.Imm(R2, 0x0f),
		asm.JLT.Imm(R2, 5, "pass"),
		asm.LSh.Imm(R2, 2), // inner header length
		asm.LoadMem(R7, R10, iip+2, asm.Half),
		asm.HostTo(asm.BE, R7, asm.Half), // inner IPv4 length
		asm.JLT.Reg(R7, R2, "pass"),
		// The outer IPv4 header checksum, as ip_rcv checks it.
	}
	insns = append(insns, headerSumInsns(ip)...)
	insns = append(insns,
		asm.JNE.Imm(R0, 0xffff, "pass"),
		// rx[outer source, inner source]: a peer's, and inside its subnets;
		// its value says whether the peer's packets take the fast path.
		asm.StoreImm(R10, keyOff, 64, asm.Word),
		asm.LoadMem(R2, R10, ip+12, asm.Word),
		asm.StoreMem(R10, keyOff+4, R2, asm.Word),
		asm.LoadMem(R2, R10, iip+12, asm.Half),
		asm.StoreMem(R10, keyOff+8, R2, asm.Half),
		asm.LoadMem(R2, R10, iip+14, asm.Half),
		asm.StoreMem(R10, keyOff+10, R2, asm.Half),
		asm.LoadMapPtr(R1, rx.FD()),
		asm.Mov.Reg(R2, R10),
		asm.Add.Imm(R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(R0, 0, "pass"),
		asm.Mov.Reg(R9, R0),
		asm.LoadMem(R2, R9, 0, asm.Word),
		asm.JNE.Imm(R2, rxFast, "pass"),
		// One datagram, whose lengths agree: UDP = inner IPv4 + 30, outer
		// IPv4 = UDP + 20, skb = outer IPv4 + 14. A super-packet whose do
		// not holds several datagrams.
		asm.LoadMem(R8, R6, skbGSOSize, asm.Word),
		asm.LoadMem(R3, R10, udp+4, asm.Half),
		asm.HostTo(asm.BE, R3, asm.Half),
		asm.Mov.Reg(R4, R7),
		asm.Add.Imm(R4, udpHeaderLen+vxlanHeaderLen+ethHeaderLen),
		asm.JNE.Reg(R3, R4, "mismatch"),
		asm.LoadMem(R4, R10, ip+2, asm.Half),
		asm.HostTo(asm.BE, R4, asm.Half),
		asm.Add.Imm(R3, ipv4HeaderLenMin),
		asm.JNE.Reg(R4, R3, "mismatch"),
		asm.LoadMem(R3, R6, skbLen, asm.Word),
		asm.Add.Imm(R4, ethHeaderLen),
		asm.JNE.Reg(R3, R4, "mismatch"),
		// Within the MTU: the packet, or for a super-packet its segments
		// (an MSS that leaves room for the IPv4 and TCP headers).
		asm.JNE.Imm(R8, 0, "gso"),
		asm.JGT.Imm(R7, int32(p.mtu), "pass"),
		asm.Ja.Label("decap"),
		asm.JGT.Imm(R8, int32(p.mtu-ipv4HeaderLenMin-tcpHeaderLenMin), "pass").WithSymbol("gso"),
		// Take off outer IPv4, UDP, VXLAN and the inner Ethernet header
		// (the MSS stays), then put the inner MACs where the outer were.
		asm.Mov.Reg(R1, R6).WithSymbol("decap"),
		asm.Mov.Imm(R2, -encapLen),
		asm.Mov.Imm(R3, adjRoomMAC),
		asm.Mov.Imm(R4, adjFixedGSO),
		asm.FnSkbAdjustRoom.Call(),
		asm.JNE.Imm(R0, 0, "pass"), // unchanged on failure
		asm.Mov.Reg(R1, R6),
		asm.Mov.Imm(R2, 0),
		asm.Mov.Reg(R3, R10),
		asm.Add.Imm(R3, inner),
		asm.Mov.Imm(R4, ethHeaderLen),
		asm.Mov.Imm(R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(R0, 0, "error"),
		asm.LoadMem(R8, R6, skbLen, asm.Word),
	)
	insns = append(insns, countInsns(stats, fastRxFrames, R8, "deliver")...)
	insns = append(insns,
		asm.Mov.Imm(R1, int32(p.tap)).WithSymbol("deliver"),
		asm.Mov.Imm(R2, redirectIngress),
		asm.FnRedirect.Call(),
		asm.Return(),
		// Lengths that do not match: a single packet (padded, or odd) just
		// goes on; a super-packet hands its peer to the userspace path,
		// counted once by whichever CPU swapped the value.
		asm.JEq.Imm(R8, 0, "pass").WithSymbol("mismatch"),
		asm.Mov.Imm(R2, rxUserspace),
		xchg(R9, R2),
		asm.JNE.Imm(R2, rxFast, "pass"),
	)
	insns = append(insns, countInsns(stats, fastDemoted, asm.R0, "pass")...)
	insns = append(insns, asm.Ja.Label("pass"))
	return append(insns, errorInsns(stats)...)
}

// xchg is an atomic exchange of the word at dst with src, src getting the
// old value. cilium/ebpf v0.22's Instruction.Marshal takes the immediate
// before it fills in the atomic operation's code (BPF_XCHG | BPF_FETCH),
// so it would send 0, an atomic add; the code is set here.
func xchg(dst, src asm.Register) asm.Instruction {
	ins := asm.Xchg.Mem(dst, src, asm.Word, 0)
	ins.Constant = 0xe1
	return ins
}
