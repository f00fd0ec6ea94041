package flows

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strconv"

	"github.com/weft-net/weft/flow"
)

// Names are the pods known by address: "namespace/name" (in the lab, the
// pod's name alone).
type Names map[netip.Addr]string

func (n Names) end(a netip.Addr, port uint16) string {
	s := a.String()
	if name, ok := n[a]; ok {
		s = name + "(" + s + ")"
	}
	if port != 0 {
		s += ":" + strconv.Itoa(int(port))
	}
	return s
}

// Text prints one flow on a line:
//
//	15:04:05.000 node2 DROPPED tcp node1-pod1(10.244.1.2):40122 -> shop/db(10.244.2.3):5432 default deny (ingress): …
//	15:04:06.120 node1 CLOSED  tcp a(10.244.1.2):40123 -> b(10.244.2.3):80 sent 1.2 kB/9 pkts, back 5.1 kB/8 pkts
func Text(w io.Writer, f flow.Flow, names Names) error {
	what := map[string]string{flow.EventDrop: "DROPPED", flow.EventNew: "ALLOWED", flow.EventClose: "CLOSED"}[f.Event]
	tail := ""
	switch f.Event {
	case flow.EventDrop:
		tail = f.Reason()
	case flow.EventClose:
		if c := f.Counts; c != nil {
			tail = fmt.Sprintf("sent %s/%d pkts, back %s/%d pkts", size(c.OrigBytes), c.OrigPackets, size(c.ReplyBytes), c.ReplyPackets)
		} else {
			tail = "counts unknown (nf_conntrack_acct off on the node)"
		}
	}
	if f.Service.IsValid() {
		tail = "via Service " + f.Service.String() + " " + tail
	}
	if f.Masqueraded {
		tail = "masqueraded as " + f.MasqueradedAs.String() + " " + tail
	}
	_, err := fmt.Fprintf(w, "%s %-8s %-7s %-6s %s -> %s %s\n", f.Time.Local().Format("15:04:05.000"), f.Node, what, f.Proto,
		names.end(f.Src, f.SrcPort), names.end(f.Dst, f.DstPort), tail)
	return err
}

func size(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// JSONLine prints one flow as a JSON object on a line, with the pods'
// names when known and the reason of a drop.
func JSONLine(w io.Writer, f flow.Flow, names Names) error {
	return json.NewEncoder(w).Encode(struct {
		flow.Flow
		SrcPod string `json:"srcPod,omitempty"`
		DstPod string `json:"dstPod,omitempty"`
		Reason string `json:"reason"`
	}{f, names[f.Src], names[f.Dst], f.Reason()})
}
