package uvxlan

// Scenarios for the coalescer's oracle (gro_oracle_test.go): TCP flows as
// their senders put them on the wire, with the network's reordering,
// duplication and loss-repair mixed in, interleaved in receive batches.
// Frames are built here without the package's helpers.

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
)

type oRand struct {
	data []byte
	pcg  *rand.Rand
}

func newORand(seed uint64, data []byte) *oRand {
	return &oRand{data: data, pcg: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (r *oRand) IntN(n int) int {
	if n <= 1 {
		return 0
	}
	if len(r.data) >= 2 {
		v := int(binary.BigEndian.Uint16(r.data))
		r.data = r.data[2:]
		return v % n
	}
	return r.pcg.IntN(n)
}

// oFlow is one TCP flow of a scenario, as its sender sees it.
type oFlow struct {
	id         int
	v6         bool
	mac        [6]byte
	src, dst   []byte
	sport      uint16
	dport      uint16
	seq, ack   uint32
	win        uint16
	ts         uint32 // timestamp option value; 0: no options
	tos, ttl   uint8
	df         bool
	ipid       uint16
	mss        int
	partialPct int // share of segments sent with a partial checksum
	sent       []oSent
	history    [][2]uint32 // seq, length of data segments sent
}

// oSent is one frame handed to the coalescer.
type oSent struct {
	frame []byte
	cs    l4Csum
}

// oSpec is one segment to build.
type oSpec struct {
	seq     uint32
	flags   uint8
	payload int
	partial bool
	ipOpts  bool // IPv4 options
	frag    bool // IPv4 more-fragments
	ext     bool // IPv6 hop-by-hop header
}

var oDstMAC = [6]byte{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01}

// oPayload is the byte at stream position seq of flow id.
func oPayload(id int, seq uint32) byte { return byte(seq*7 + uint32(id)*13 + seq>>9) }

// build makes the Ethernet frame of segment sp of flow f.
func (f *oFlow) build(sp oSpec) ([]byte, l4Csum) {
	tcpLen := 20
	if f.ts != 0 {
		tcpLen = 32
	}
	ipLen := 20
	switch {
	case f.v6 && sp.ext:
		ipLen = 48
	case f.v6:
		ipLen = 40
	case sp.ipOpts:
		ipLen = 24
	}
	b := make([]byte, 14+ipLen+tcpLen+sp.payload)
	f.buildIP(b, sp, ipLen, tcpLen)
	ip := b[14:]
	th := ip[ipLen:]
	binary.BigEndian.PutUint16(th, f.sport)
	binary.BigEndian.PutUint16(th[2:], f.dport)
	binary.BigEndian.PutUint32(th[4:], sp.seq)
	binary.BigEndian.PutUint32(th[8:], f.ack)
	th[12], th[13] = byte(tcpLen/4)<<4, sp.flags
	binary.BigEndian.PutUint16(th[14:], f.win)
	if f.ts != 0 {
		copy(th[20:], []byte{1, 1, 8, 10})
		binary.BigEndian.PutUint32(th[24:], f.ts)
		binary.BigEndian.PutUint32(th[28:], 77)
	}
	for i := range sp.payload {
		th[tcpLen+i] = oPayload(f.id, sp.seq+uint32(i))
	}
	pseudo := oSum(f.src, 0) + oSum(f.dst, 0) + 6 + uint32(tcpLen+sp.payload)
	if sp.partial {
		binary.BigEndian.PutUint16(th[16:], oFold(pseudo))
		return b, l4Csum{uint16(14 + ipLen), 16}
	}
	binary.BigEndian.PutUint16(th[16:], ^oFold(oSum(th, pseudo)))
	return b, l4Csum{}
}

// buildIP fills in the Ethernet and IP headers of segment sp in b.
func (f *oFlow) buildIP(b []byte, sp oSpec, ipLen, tcpLen int) {
	copy(b, oDstMAC[:])
	copy(b[6:], f.mac[:])
	ip := b[14:]
	if f.v6 {
		binary.BigEndian.PutUint16(b[12:], 0x86dd)
		ip[0], ip[1], ip[2], ip[3] = 0x60|f.tos>>4, f.tos<<4, 0x01, byte(f.id)
		binary.BigEndian.PutUint16(ip[4:], uint16(ipLen-40+tcpLen+sp.payload))
		ip[6], ip[7] = 6, f.ttl
		copy(ip[8:], f.src)
		copy(ip[24:], f.dst)
		if sp.ext {
			ip[6] = 0
			copy(ip[40:], []byte{6, 0, 1, 4, 0, 0, 0, 0})
		}
	} else {
		binary.BigEndian.PutUint16(b[12:], 0x0800)
		ip[0], ip[1] = 0x40|byte(ipLen/4), f.tos
		binary.BigEndian.PutUint16(ip[2:], uint16(ipLen+tcpLen+sp.payload))
		binary.BigEndian.PutUint16(ip[4:], f.ipid)
		f.ipid++
		if f.df {
			ip[6] = 0x40
		}
		if sp.frag {
			ip[6] |= 0x20
		}
		ip[8], ip[9] = f.ttl, 6
		copy(ip[12:], f.src)
		copy(ip[16:], f.dst)
		if sp.ipOpts {
			copy(ip[20:], []byte{0x94, 4, 0, 0}) // router alert
		}
		binary.BigEndian.PutUint16(ip[10:], ^oFold(oSum(ip[:ipLen], 0)))
	}
}

// send builds sp and records it as the flow's next input.
func (f *oFlow) send(sp oSpec) oSent {
	fr, cs := f.build(sp)
	s := oSent{fr, cs}
	f.sent = append(f.sent, s)
	if sp.payload > 0 {
		f.history = append(f.history, [2]uint32{sp.seq, uint32(sp.payload)})
	}
	return s
}

func newOFlow(r *oRand, id int) *oFlow {
	f := &oFlow{
		id: id, v6: r.IntN(3) == 0, sport: uint16(20000 + id), dport: uint16(5201 + id%3),
		seq: uint32(r.IntN(1 << 16)), ack: 1000, win: 500, tos: 0, ttl: 64,
		df: r.IntN(4) != 0, ipid: uint16(r.IntN(1 << 16)), partialPct: []int{0, 0, 30, 100}[r.IntN(4)],
	}
	if r.IntN(4) == 0 {
		f.seq = 0 - uint32(1+r.IntN(50000)) // wraps around
	}
	f.mac = [6]byte{0x02, 0x11, 0, 0, byte(id >> 8), byte(id)}
	if r.IntN(2) == 0 {
		f.ts = 1 + uint32(r.IntN(1000))
	}
	f.mss = []int{1448, 1448, 1386, 1000, 536, 100, 1 + r.IntN(1448)}[r.IntN(7)]
	if f.v6 {
		f.src = []byte{0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(id % 3), 2}
		f.dst = []byte{0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 3}
	} else {
		f.src = []byte{10, 244, byte(id % 3), 2}
		f.dst = []byte{10, 244, 9, 3}
	}
	return f
}

// data sends the flow's next n bytes.
func (f *oFlow) data(r *oRand, n int, flags uint8, out []oSent) []oSent {
	sp := oSpec{seq: f.seq, flags: tcpFlagACK | flags, payload: n, partial: r.IntN(100) < f.partialPct}
	f.seq += uint32(n)
	return append(out, f.send(sp))
}

// step sends what one random event of flow f puts on the wire.
func (f *oFlow) step(r *oRand, out []oSent) []oSent {
	ctl := func(flags uint8, n int) []oSent {
		sp := oSpec{seq: f.seq, flags: flags, payload: n}
		f.seq += uint32(n)
		return append(out, f.send(sp))
	}
	e := r.IntN(100)
	switch {
	case e < 55:
		return f.data(r, f.mss, 0, out)
	case e < 60:
		return f.data(r, f.mss, tcpFlagPSH, out)
	case e < 66:
		return f.data(r, 1+r.IntN(f.mss), []uint8{0, tcpFlagPSH}[r.IntN(2)], out)
	case e < 70:
		return ctl(tcpFlagACK, 0)
	case e < 72:
		return ctl(tcpFlagACK|tcpFlagFIN, r.IntN(2)*r.IntN(f.mss))
	case e < 73:
		return ctl(tcpFlagACK|tcpFlagRST, 0)
	case e < 74:
		return ctl(tcpFlagSYN, 0)
	case e < 75:
		return f.data(r, f.mss, tcpFlagURG, out)
	case e < 78 && len(f.history) > 0: // retransmission
		h := f.history[r.IntN(len(f.history))]
		return append(out, f.send(oSpec{seq: h[0], flags: tcpFlagACK, payload: int(h[1])}))
	case e < 80 && len(f.sent) > 0: // the network duplicates a frame
		last := f.sent[len(f.sent)-1]
		f.sent = append(f.sent, last)
		return append(out, last)
	case e < 82: // out of window
		return append(out, f.send(oSpec{seq: f.seq + 1<<31, flags: tcpFlagACK, payload: f.mss}))
	case e < 86:
		return f.reorder(r, out)
	}
	return f.rare(r, e, out)
}

// rare sends what the less frequent events e put on the wire: changes of
// the headers (then a full segment), unusual flags, IP options,
// fragments.
func (f *oFlow) rare(r *oRand, e int, out []oSent) []oSent {
	switch {
	case e < 88:
		f.win += uint16(1 + r.IntN(3))
	case e < 89:
		f.ack += uint32(1 + r.IntN(3000))
	case e < 91 && f.ts != 0:
		f.ts++
	case e < 92:
		return f.data(r, f.mss, tcpFlagCWR, out)
	case e < 93:
		return f.data(r, f.mss, tcpFlagECE, out)
	case e < 94:
		sp := oSpec{seq: f.seq, flags: tcpFlagACK, payload: f.mss, ipOpts: !f.v6, ext: f.v6}
		f.seq += uint32(f.mss)
		return append(out, f.send(sp))
	case e < 95 && !f.v6: // first fragment: MF set
		sp := oSpec{seq: f.seq, flags: tcpFlagACK, payload: f.mss, frag: true}
		f.seq += uint32(f.mss)
		return append(out, f.send(sp))
	case e < 96:
		f.ttl--
	case e < 97:
		f.ipid += uint16(1 + r.IntN(100))
	case e < 98:
		f.tos ^= 0x03 // ECN CE
	case e < 99:
		f.mac[5] ^= 0x80 // another sender MAC
	case !f.v6:
		f.df = !f.df
	}
	return f.data(r, f.mss, 0, out)
}

const tcpFlagECE = 0x40

// reorder sends the flow's next 2 to 4 segments in another order, as a
// network may.
func (f *oFlow) reorder(r *oRand, out []oSent) []oSent {
	k := 2 + r.IntN(3)
	batch := make([]oSent, k)
	for i := range batch {
		sp := oSpec{seq: f.seq, flags: tcpFlagACK, payload: f.mss, partial: r.IntN(100) < f.partialPct}
		switch r.IntN(12) {
		case 0:
			sp.flags |= tcpFlagPSH
		case 1:
			sp.flags |= tcpFlagCWR
		case 2:
			sp.payload = 1 + r.IntN(f.mss)
		case 3:
			sp.payload = f.mss + 1 + r.IntN(100)
		case 4:
			f.ipid += 5
		}
		f.seq += uint32(sp.payload)
		fr, cs := f.build(sp)
		batch[i] = oSent{fr, cs}
	}
	if r.IntN(3) == 0 {
		for i := range batch { // shuffle
			j := i + r.IntN(k-i)
			batch[i], batch[j] = batch[j], batch[i]
		}
	} else {
		slices.Reverse(batch)
	}
	f.sent = append(f.sent, batch...)
	return append(out, batch...)
}

// oOther builds a frame that is not TCP: UDP or ARP.
func oOther(r *oRand, n int) []byte {
	if r.IntN(2) == 0 {
		b := make([]byte, 42)
		copy(b, oDstMAC[:])
		binary.BigEndian.PutUint16(b[12:], 0x0806)
		b[41] = byte(n)
		return b
	}
	b := make([]byte, 14+20+8+1+r.IntN(200))
	copy(b, oDstMAC[:])
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:], []byte{10, 244, 1, 2, 10, 244, 9, 3})
	binary.BigEndian.PutUint16(ip[10:], ^oFold(oSum(ip[:20], 0)))
	binary.BigEndian.PutUint16(ip[20:], uint16(n))
	binary.BigEndian.PutUint16(ip[24:], uint16(len(ip)-20))
	return b
}

// oScenario is a random interleaving of many flows' segments in batches.
type oScenario struct {
	flows   []*oFlow
	batches [][]oSent // frames per receive batch, in arrival order
	other   []oSent   // the non-TCP frames, in order
}

func newOScenario(r *oRand, nflows, nframes, flushPct int) *oScenario {
	sc := &oScenario{}
	for i := range nflows {
		sc.flows = append(sc.flows, newOFlow(r, i))
	}
	var batch []oSent
	cur := sc.flows[0]
	for len(batch) > 0 || nframes > 0 {
		if nframes <= 0 || r.IntN(100) < flushPct {
			sc.batches = append(sc.batches, batch)
			batch = nil
			continue
		}
		if r.IntN(4) == 0 { // trains of one flow, as UDP GRO delivers them
			cur = sc.flows[r.IntN(len(sc.flows))]
		}
		n := len(batch)
		if r.IntN(50) == 0 {
			o := oSent{frame: oOther(r, len(sc.other))}
			sc.other = append(sc.other, o)
			batch = append(batch, o)
		} else {
			batch = cur.step(r, batch)
		}
		nframes -= len(batch) - n
	}
	return sc
}
