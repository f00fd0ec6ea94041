package fdstore

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// childEnv makes the test binary act as the service (serviceMain).
const childEnv = "WEFT_FDSTORE_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		serviceMain()
		return
	}
	os.Exit(m.Run())
}

// serviceMain is the service the tests start: it takes each file named on
// stdin, reads one line from it and prints it, then runs the commands
// that follow ("keep NAME" stores a new pipe whose reader holds NAME's
// line, "release NAME", "env" prints what is left of LISTEN_*).
func serviceMain() {
	s, err := FromEnv(nil)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("unclaimed", strings.Join(s.Unclaimed(), ","))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, name, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "take":
			f := s.Take(name)
			if f == nil {
				fmt.Println("none", name)
				continue
			}
			line, _ := bufio.NewReader(f).ReadString('\n')
			fmt.Println("took", name, strings.TrimSpace(line))
		case "keep":
			r, w, _ := os.Pipe()
			fmt.Fprintln(w, "line-of-"+name)
			if err := s.Keep(name, int(r.Fd())); err != nil {
				fmt.Println("error", err)
			}
			r.Close()
			w.Close()
		case "release":
			if err := s.Release(name); err != nil {
				fmt.Println("error", err)
			}
		case "env":
			fmt.Printf("env %q %q %q\n", os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES"), os.Getenv("NOTIFY_SOCKET"))
		}
		fmt.Println("done")
	}
}

// start runs the service under k with the commands and returns its output.
func start(t *testing.T, k *Keeper, wrap bool, cmds ...string) []string {
	t.Helper()
	argv := []string{os.Args[0], "-test.run=^$"}
	if wrap {
		argv = Wrap(argv)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	closeFiles, err := k.Prepare(cmd)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Start()
	closeFiles()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("service: %v: %s", err, b)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "done" {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestKeepAcrossRestarts runs a service three times under one Keeper:
// what it keeps reaches the next run under its name, a release and a
// replacement take effect, and the LISTEN_* variables are gone from the
// service's environment once read.
func TestKeepAcrossRestarts(t *testing.T) {
	k, err := NewKeeper(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()

	got := start(t, k, true, "keep tap0", "keep rx0", "keep old", "env")
	want := []string{"unclaimed ", `env "" "" ""`}
	if !slices.Equal(got, want) {
		t.Fatalf("first run: %q, want %q", got, want)
	}
	if names := k.Names(); !slices.Equal(names, []string{"tap0", "rx0", "old"}) {
		t.Fatalf("keeper holds %q", names)
	}

	got = start(t, k, true, "take tap0", "take rx0", "take rx0", "release old", "keep tap0", "env")
	want = []string{"unclaimed old,rx0,tap0", "took tap0 line-of-tap0", "took rx0 line-of-rx0", "none rx0", `env "" "" ""`}
	if !slices.Equal(got, want) {
		t.Fatalf("second run: %q, want %q", got, want)
	}
	// The keeper still holds rx0 (taken, not released) and the new tap0.
	if names := k.Names(); !slices.Equal(names, []string{"tap0", "rx0"}) && !slices.Equal(names, []string{"rx0", "tap0"}) {
		t.Fatalf("keeper holds %q", names)
	}

	got = start(t, k, true, "take tap0")
	if !slices.Contains(got, "took tap0 line-of-tap0") {
		t.Fatalf("third run: %q", got)
	}
	if err := k.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestOtherPID: files passed with LISTEN_PID of another process are not
// taken (they were meant for a parent that exec'd this one).
func TestOtherPID(t *testing.T) {
	k, err := NewKeeper(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	start(t, k, true, "keep tap0")
	// Without Wrap, LISTEN_PID is not set at all: nothing is inherited.
	got := start(t, k, false, "take tap0")
	if !slices.Equal(got, []string{"unclaimed ", "none tap0"}) {
		t.Fatalf("got %q", got)
	}
}

// TestNames: systemd's rule for FDNAME is enforced before anything is sent.
func TestNames(t *testing.T) {
	s := &Store{notify: "/nonexistent"}
	for _, bad := range []string{"", "a:b", "a b", "tab\t", strings.Repeat("x", 256), "é"} {
		if err := s.Keep(bad, 0); err == nil {
			t.Errorf("Keep(%q): no error", bad)
		}
		if err := s.Release(bad); err == nil {
			t.Errorf("Release(%q): no error", bad)
		}
	}
	for _, good := range []string{"weft-u.1-tap0", "weft-u6.1-rx15", strings.Repeat("x", 255)} {
		if err := checkName(good); err != nil {
			t.Errorf("checkName(%q): %v", good, err)
		}
	}
}

// TestWithoutManager: no NOTIFY_SOCKET, no LISTEN_*: nothing inherited,
// Keep and Release succeed doing nothing; a nil *Store behaves the same.
func TestWithoutManager(t *testing.T) {
	for _, v := range []string{"NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		t.Setenv(v, "")
	}
	s, err := FromEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	var nilStore *Store
	for _, st := range []*Store{s, nilStore} {
		if st.Enabled() || st.Take("x") != nil || len(st.Unclaimed()) != 0 {
			t.Fatalf("%v: not empty", st)
		}
		if err := st.Keep("x", 0); err != nil {
			t.Fatal(err)
		}
		if err := st.Release("x"); err != nil {
			t.Fatal(err)
		}
		if err := st.Notify("READY=1"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNotify: Notify sends the state to NOTIFY_SOCKET as one datagram.
func TestNotify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify.sock")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	s, err := FromEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Notify("READY=1\nSTATUS=up"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	ln.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := ln.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1\nSTATUS=up" {
		t.Fatalf("received %q, %v", buf[:n], err)
	}
}

// TestBadCount: a LISTEN_FDS that is not a count is an error, not a guess.
func TestBadCount(t *testing.T) {
	t.Setenv("LISTEN_PID", fmt.Sprint(os.Getpid()))
	t.Setenv("LISTEN_FDS", "two")
	if _, err := FromEnv(nil); err == nil || !strings.Contains(err.Error(), "LISTEN_FDS") {
		t.Fatalf("err = %v", err)
	}
}

// TestKeeperOrder: a removal and a store of one name sent back to back are
// applied in order, also when the keeper reads them late.
func TestKeeperOrder(t *testing.T) {
	k, err := NewKeeper(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	s := &Store{notify: k.Socket()}
	r, w, _ := os.Pipe()
	defer w.Close()
	for range 50 {
		if err := s.Keep("q", int(r.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()
	if !k.WaitFor(5*time.Second, "q") {
		t.Fatal("keeper never held q")
	}
	if names := k.Names(); !slices.Equal(names, []string{"q"}) {
		t.Fatalf("keeper holds %q, want one q", names)
	}
}
