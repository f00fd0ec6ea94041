package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/policy"
)

// TestNetworkPolicyDropFlood floods a pod isolated for ingress (np-x/b on
// n2) with UDP from np-y/a on n1 for 5 s, as fast as one socket sends, and
// reads what n2's weftd spent: its resident memory must not grow by more
// than 32 MiB (the ring of flows is about 2 MB, whatever comes), the drops
// it logged must stay within the table's rate limit, and the table must
// count every drop. Its CPU time and the rates are logged (not asserted:
// the machine is shared).
func TestNetworkPolicyDropFlood(t *testing.T) {
	e := newNPEnv(t)
	from, to := e.pod("np-y", "a"), e.pod("np-x", "b")
	n2 := e.c.Nodes[1]
	e.apply(t, []*networkingv1.NetworkPolicy{npPolicy("np-x", "deny", nil, ingressOnly)})
	Eventually(t, 10*time.Second, "new connection refused", func() error {
		if try(probe{from, to, corev1.ProtocolTCP, 80}) {
			return fmt.Errorf("still allowed")
		}
		return nil
	})
	time.Sleep(time.Second) // the log's bucket fills again
	pid := n2.PID()
	rss0, cpu0 := procUsage(t, pid)
	logged0 := droppedLogged(t, n2)
	sent, elapsed := floodUDP(t, from, to, 5*time.Second)
	time.Sleep(500 * time.Millisecond) // weftd reads what was logged
	rss1, cpu1 := procUsage(t, pid)
	logged := droppedLogged(t, n2) - logged0
	out := n2.NS.Run
	list, err := out("nft", "list", "chain", "inet", policy.Table, "ingress")
	if err != nil {
		t.Fatal(err)
	}
	counted := dropCounter(list)
	t.Logf("flood: %d packets in %s (%.0f/s); n2 dropped %d (table counter), weftd got %d logged drops; weftd RSS %d → %d KiB, CPU %.2f s over %.1f s (%.0f%% of one core)",
		sent, elapsed.Round(time.Millisecond), float64(sent)/elapsed.Seconds(), counted, logged, rss0, rss1, cpu1-cpu0, elapsed.Seconds()+0.5, 100*(cpu1-cpu0)/(elapsed.Seconds()+0.5))
	if rss1-rss0 > 32<<10 {
		t.Errorf("weftd's memory grew by %d KiB under the flood", rss1-rss0)
	}
	if bound := int64(policy.LogBurst) + int64((elapsed.Seconds()+0.5)*policy.LogRate) + 1; logged > bound {
		t.Errorf("weftd saw %d logged drops, more than the limit allows (%d)", logged, bound)
	}
	if counted < sent/2 {
		t.Errorf("the table counted %d drops of %d sent", counted, sent)
	}
	var page flow.Page
	_, body, err := n2.HTTPGet("http://127.0.0.1:9470/flows?limit=1")
	if err == nil && json.Unmarshal([]byte(body), &page) == nil {
		t.Logf("n2's ring: %+v", page.Stats)
	}
}

// floodUDP sends small datagrams from one pod to another for d.
func floodUDP(t *testing.T, from, to *npPod, d time.Duration) (int64, time.Duration) {
	var n int64
	start := time.Now()
	err := from.net.Do(func() error {
		c, err := net.Dial("udp", net.JoinHostPort(to.ip.String(), "9"))
		if err != nil {
			return err
		}
		defer c.Close()
		b := []byte("flood")
		for time.Since(start) < d {
			for range 1000 {
				if _, err := c.Write(b); err == nil {
					n++
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, time.Since(start)
}

// droppedLogged is n's weft_policy_verdicts_total of dropped verdicts.
func droppedLogged(t *testing.T, n *Node) int64 {
	v, err := n.Metric("weft_policy_verdicts_total", "verdict", "dropped")
	if err != nil && !strings.Contains(err.Error(), "no metric") {
		t.Fatal(err)
	}
	return int64(v)
}

// procUsage is a process's resident memory (KiB) and CPU time (s).
func procUsage(t *testing.T, pid int) (int64, float64) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var rss int64
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			rss, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:]) // fields from 3 on
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return rss, (ut + st) / 100 // USER_HZ
}

// dropCounter reads the packets of the chain's counted drop.
func dropCounter(list string) int64 {
	for _, l := range strings.Split(list, "\n") {
		f := strings.Fields(l)
		for i := 0; i+2 < len(f); i++ {
			if f[i] == "counter" && f[i+1] == "packets" {
				n, _ := strconv.ParseInt(f[i+2], 10, 64)
				return n
			}
		}
	}
	return -1
}
