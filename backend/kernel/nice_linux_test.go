package kernel

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestSetProcessNice runs in a child process (the nice value would stay
// with this test binary's threads otherwise) and checks that every thread,
// and a thread and a process started afterwards, have the new value.
func TestSetProcessNice(t *testing.T) {
	if os.Getenv("WEFT_NICE_CHILD") != "" {
		niceChild(t)
		return
	}
	if os.Geteuid() != 0 {
		nettest.CannotRun(t, nettest.SkipRoot, "lowering the nice value needs root")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestSetProcessNice$", "-test.v")
	cmd.Env = append(os.Environ(), "WEFT_NICE_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func niceChild(t *testing.T) {
	if err := SetProcessNice(-7); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		if n, err := ThreadNice(tid); err != nil || n != -7 {
			t.Errorf("thread %d: nice %d (%v), want -7", tid, n, err)
		}
	}
	// A new thread (a goroutine locked to one, which the runtime may have
	// to create) and a new process inherit the value.
	done := make(chan int)
	go func() {
		lockThread()
		n, _ := ThreadNice(0)
		done <- n
	}()
	if n := <-done; n != -7 {
		t.Errorf("later thread: nice %d, want -7", n)
	}
	out, err := exec.Command("sh", "-c", "cut -d' ' -f19 /proc/self/stat").Output()
	if err != nil || strings.TrimSpace(string(out)) != "-7" {
		t.Errorf("child process: nice %q (%v), want -7", out, err)
	}
	if err := SetProcessNice(20); err == nil {
		t.Error("nice 20 accepted")
	}
}

func lockThread() { runtime.LockOSThread() }
