package nettest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// OwnTable makes another program own table family name in n, taking it
// over if it exists: `nft -i` deletes it and creates it again with flag
// owner in one transaction, and keeps its netlink socket open, so that the
// kernel refuses every other program's change to the table (EPERM) until
// release, which ends nft; the kernel then deletes the table. It is
// released when the test ends too.
func OwnTable(tb testing.TB, n *NS, family, name string) (release func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := n.Command(ctx, "nft", "-i")
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		in.Close() // nft -i ends at the end of its input
		select {
		case err := <-exited:
			if err != nil {
				tb.Errorf("nft -i holding table %s %s: %v: %s", family, name, err, out.String())
			}
		case <-time.After(5 * time.Second):
			cancel()
			<-exited
			tb.Errorf("nft -i holding table %s %s did not end with its input; killed", family, name)
		}
		cancel()
	}
	tb.Cleanup(release)
	t := family + " " + name
	if _, err := io.WriteString(in, "add table "+t+"; delete table "+t+"; add table "+t+" { flags owner ; }\n"); err != nil {
		tb.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		list, _ := n.Run("nft", "list", "table", family, name)
		if strings.Contains(list, "flags owner") {
			return release
		}
		if time.Now().After(deadline) {
			done = true
			in.Close()
			select {
			case <-exited: // its output is complete
			case <-time.After(5 * time.Second):
				cancel()
				<-exited
			}
			cancel()
			tb.Fatalf("table %s not owned by nft -i in %s within 10 s: %s; nft -i said: %s", t, n.Name, list, out.String())
		}
	}
}
