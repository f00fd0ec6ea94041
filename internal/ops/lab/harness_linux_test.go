package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/testlog"
)

// weftctl builds weftctl, weftd and the weft plugin into one directory, so
// that weftctl finds the other two next to itself, as documented.
func weftctl(t *testing.T) string {
	t.Helper()
	nettest.RequireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("iproute2's ip is required: apt-get install iproute2")
	}
	bin := nettest.Binary(t, "weftctl")
	for _, name := range []string{"weftd", "weft"} {
		if p := nettest.Binary(t, name); filepath.Dir(p) != filepath.Dir(bin) {
			t.Fatalf("%s built in %s, weftctl in %s", name, p, bin)
		}
	}
	return bin
}

// upProc is a `weftctl lab up` running in the background.
type upProc struct {
	cmd  *exec.Cmd
	out  *testlog.Buffer
	done chan struct{}
	err  error
}

// labUp starts `weftctl lab up --state-dir dir args…` and waits for its
// ready line. At the end of the test the lab is taken down whatever
// happened, so a failing test leaves nothing behind either.
func labUp(t *testing.T, bin, dir string, args ...string) *upProc {
	t.Helper()
	p := &upProc{out: &testlog.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"lab", "up", "--state-dir", dir}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(40 * time.Second):
				p.cmd.Process.Kill()
				<-p.done
			}
		}
		exec.Command(bin, "lab", "down", "--state-dir", dir).Run()
	})
	deadline := time.After(150 * time.Second)
	for !strings.Contains(p.out.String(), ReadyLine) {
		select {
		case <-p.done:
			t.Fatalf("lab up exited (%v) before it was ready:\n%s", p.err, p.out.String())
		case <-deadline:
			t.Fatalf("lab up not ready after 150s:\n%s", p.out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return p
}

// wait waits for lab up to exit and returns its error.
func (p *upProc) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		t.Fatalf("lab up still running after %s:\n%s", timeout, p.out.String())
		return nil
	}
}

// run runs weftctl and returns its combined output and exit code.
func run(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("weftctl %v: %v\n%s", args, err, out)
	return "", -1
}

// runNoFatal is run for other goroutines than the test's: it returns -1
// with the error as output instead of failing the test.
func runNoFatal(bin string, args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	return fmt.Sprintf("%v\n%s", err, out), -1
}

// ipIn runs iproute2 (or another tool) inside a namespace.
func ipIn(t *testing.T, ns string, argv ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(argv, " "), ns, err, out)
	}
	return string(out)
}

// rootLinks lists the root namespace's links, to prove the lab adds none.
func rootLinks(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			names = append(names, strings.TrimSuffix(f[1], ":"))
		}
	}
	slices.Sort(names)
	return names
}

// assertGone checks that nothing of the lab recorded in st is left: no
// namespace with its prefix, no recorded process, no state directory.
func assertGone(t *testing.T, dir string, st *State) {
	t.Helper()
	names, err := ownedNamespaces(st.Prefix)
	if err != nil || len(names) > 0 {
		t.Errorf("namespaces left: %v (%v)", names, err)
	}
	for _, n := range st.Nodes {
		if n.Weftd.Alive() {
			t.Errorf("weftd of %s (pid %d) still running", n.Name, n.Weftd.PID)
		}
	}
	if st.Proc.Alive() {
		t.Errorf("lab up (pid %d) still running", st.Proc.PID)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		entries, _ := os.ReadDir(dir)
		t.Errorf("state dir %s left (%v): %v", dir, err, entries)
	}
}

// rootNetState is what the lab must never change in the root namespace
// besides links: forwarding sysctls and the nftables ruleset.
func rootNetState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding", "/proc/sys/net/ipv4/conf/all/rp_filter"} {
		v, _ := os.ReadFile(f)
		b.WriteString(f + "=" + strings.TrimSpace(string(v)) + " ")
	}
	if out, err := exec.Command("nft", "list", "ruleset").CombinedOutput(); err == nil {
		b.WriteString("nft:" + string(out))
	}
	return b.String()
}
