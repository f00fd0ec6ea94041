package uvxlan

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestKeptFilesStopLosesNothing: with Config.Files, a Run that ends (the
// process stops on SIGTERM) leaves what it has not read in the kept queues
// and forwards all it read: no frame is read and then dropped because the
// TAP or the sockets were closed under the packet loops.
func TestKeptFilesStopLosesNothing(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	files := newMemFiles()
	t.Cleanup(files.close)
	a := newUVNodeWith(t, u, "a", subnetA, func(c *Config) { c.Files, c.FastPath = files, true })
	b := newFastNode(t, u, "b", subnetB)
	connect(t, a, b)
	if out, err := ping(a, b.podIP); err != nil {
		t.Fatalf("ping: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, args := range [][]string{{"-f", b.podIP.String()}, {"-f", "-s", "1400", b.podIP.String()}} {
		p := a.pod.Command(ctx, append([]string{"ping", "-q"}, args...)...)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	}
	cfg := a.b.Config()
	for i := range 10 {
		time.Sleep(200 * time.Millisecond)
		old := a.b
		a.stop()
		st := old.Stats()
		if n := st.Drops[DropSend.String()] + st.Drops[DropTAPWrite.String()]; n != 0 {
			t.Errorf("stop %d: %d frames read and then dropped as the run ended: %v", i, n, st.Drops)
		}
		files.restart(t)
		restartNode(t, a, b, cfg)
	}
}
