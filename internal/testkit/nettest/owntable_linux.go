package nettest

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// OwnTable makes another program own table family name in n: `nft -i`
// creates it with flag owner and keeps its netlink socket open, so that
// the kernel refuses every other program's change to the table (EPERM)
// until release, which ends nft; the kernel then deletes the table. It is
// released when the test ends too.
func OwnTable(tb testing.TB, n *NS, family, name string) (release func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := n.Command(ctx, "nft", "-i")
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			in.Close()
			if err := cmd.Wait(); err != nil && ctx.Err() == nil {
				tb.Errorf("nft -i holding table %s %s: %v", family, name, err)
			}
			cancel()
		}
	}
	tb.Cleanup(release)
	if _, err := io.WriteString(in, "add table "+family+" "+name+" { flags owner ; }\n"); err != nil {
		tb.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out, _ := n.Run("nft", "list", "table", family, name)
		if strings.Contains(out, "flags owner") {
			return release
		}
		if time.Now().After(deadline) {
			tb.Fatalf("table %s %s not owned by nft -i in %s within 10 s: %s", family, name, n.Name, out)
		}
	}
}
