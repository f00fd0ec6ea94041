package namespace_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// freshEnv marks the copy of the test binary that runs in a mount namespace
// of its own, where RunDir is a plain directory as on a freshly booted
// machine.
const freshEnv = "WEFT_TEST_FRESH_RUNDIR"

// TestNamedSeenByEarlierMountNamespaces starts from a fresh machine's state
// (RunDir a plain directory, every mount private), creates namespaces from
// several goroutines at once, starts a process in a mount namespace of its
// own (`ip netns exec`, as the tests' holders, container runtimes and CNI
// plugins run), then creates another namespace and checks that the process
// sees it as a namespace, not as the empty file beneath. It runs in a copy
// of the test binary under `unshare --mount --propagation private`, so that
// the machine's own /run/netns is left as it is.
func TestNamedSeenByEarlierMountNamespaces(t *testing.T) {
	nettest.RequireRoot(t)
	if os.Getenv(freshEnv) == "" {
		name := "^" + t.Name() + "$"
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run", name, "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), freshEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("in a private mount namespace: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
			t.Fatalf("in a private mount namespace the test did not pass:\n%s", out)
		}
		return
	}

	// The machine this runs on may already have RunDir as a mount point
	// (from iproute2, or an earlier test): undo it in this mount namespace.
	for mounts(t) > 0 {
		if err := unix.Unmount(namespace.RunDir, unix.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s: %v", namespace.RunDir, err)
		}
	}

	first := make([]*namespace.NS, 6)
	var wg sync.WaitGroup
	errs := make([]error, len(first))
	for i := range first {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first[i], errs[i] = namespace.Create(fmt.Sprintf("fresh%d", i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create namespace %d: %v", i, err)
		}
		n := first[i]
		t.Cleanup(func() { n.Delete() })
	}
	if n := mounts(t); n != 1 {
		t.Fatalf("%s is mounted %d times after six concurrent creations, want once", namespace.RunDir, n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder := first[0].Command(ctx, "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatalf("start holder: %v", err)
	}
	defer holder.Wait()
	defer cancel()
	waitOwnMountNS(t, holder.Process.Pid)

	later, err := namespace.Create("fresh-later")
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	defer later.Delete()
	if n := mounts(t); n != 1 {
		t.Fatalf("%s is mounted %d times after a later creation, want once", namespace.RunDir, n)
	}
	var st unix.Statfs_t
	seen := fmt.Sprintf("/proc/%d/root%s", holder.Process.Pid, later.Path)
	if err := unix.Statfs(seen, &st); err != nil {
		t.Fatalf("statfs %s: %v", seen, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		t.Fatalf("a process in a mount namespace made before %s was created sees a file of fs type %#x there, not a network namespace (nsfs %#x)",
			later.Path, st.Type, unix.NSFS_MAGIC)
	}
}

// mounts counts the mounts at RunDir in this mount namespace.
func mounts(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == namespace.RunDir {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitOwnMountNS waits until pid runs sleep in a mount namespace other than
// this process's.
func waitOwnMountNS(t *testing.T, pid int) {
	t.Helper()
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		mnt, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if strings.TrimSpace(string(comm)) == "sleep" && mnt != "" && mnt != self {
			return
		}
	}
	t.Fatalf("process %d did not start sleep in a mount namespace of its own", pid)
}
