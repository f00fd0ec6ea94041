package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// browser starts Debian's headless Chromium inside a network namespace of
// its own that holds only lo, and returns a tab's context and that
// namespace. The browser reaches nothing but the namespace's loopback, where
// openPage serves the page (the listener is made inside the namespace).
// chromedp drives it over a pipe (--remote-debugging-pipe, chromedp's
// default), so no DevTools port is opened either. The flags are chromedp's
// defaults plus ours, which also stop background requests. At the end the
// browser and every process of its group are killed by the browser's PID,
// before the namespace is deleted.
func browser(t *testing.T, width, height int) (context.Context, *nettest.NS) {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "Debian's chromium is needed to check the page in a browser: apt-get install -y chromium (test/setup.sh installs it)")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "iproute2's ip is needed to start the browser in a namespace")
	}
	ns := nettest.NewNS(t, "browser") // deleted last, after the browser is killed
	var (
		cmdMu sync.Mutex
		cmd   *exec.Cmd // set by chromedp's goroutine when it starts the browser
	)
	browserCmd := func() *exec.Cmd { cmdMu.Lock(); defer cmdMu.Unlock(); return cmd }
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
		chromedp.ModifyCmdFunc(func(c *exec.Cmd) {
			// ip netns exec execs the browser: its PID stays the browser's.
			c.Path, c.Args = ip, append([]string{"ip", "netns", "exec", ns.Name}, c.Args...)
			c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
			cmdMu.Lock()
			cmd = c
			cmdMu.Unlock()
		}),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		if c := browserCmd(); c != nil && c.Process != nil {
			killGroup(t, c.Process.Pid)
		}
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	c := browserCmd()
	if c == nil || c.Process == nil {
		t.Fatal("chromedp started no browser process of this test's command: its namespace cannot be checked")
	}
	checkInNamespace(t, c.Process.Pid, ns)
	checkIsolated(t, ctx)
	return ctx, ns
}

// checkIsolated serves a page on the machine's loopback and fails the test
// if the browser loads it: from its namespace, 127.0.0.1 is its own lo.
func checkIsolated(t *testing.T, ctx context.Context) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := chromedp.Do(c, chromedp.Navigate(srv.URL))
	if err == nil || hits.Load() != 0 {
		t.Fatalf("the browser reached %s on the machine's loopback (%d requests, navigation error %v): it is not confined to its namespace", srv.URL, hits.Load(), err)
	}
	t.Logf("the machine's loopback from the browser: %v", err)
}

// checkInNamespace fails the test unless the process pid runs in ns and
// ns has no link but lo.
func checkInNamespace(t *testing.T, pid int, ns *nettest.NS) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(ns.Path, &st); err != nil {
		t.Fatal(err)
	}
	got, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("net:[%d]", st.Ino); got != want {
		t.Fatalf("chromium (pid %d) runs in network namespace %s, not in %s (%s)", pid, got, ns.Name, want)
	}
	links, err := ns.Handle.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			t.Fatalf("the browser's namespace %s holds link %s: only lo may be there", ns.Name, l.Attrs().Name)
		}
	}
}

// killGroup kills the process group that the browser pid leads (its
// renderers, zygote and utility processes) and waits until it is gone.
func killGroup(t *testing.T, pid int) {
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill chromium's process group %d: %v", pid, err)
		return
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(-pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
	}
	t.Errorf("chromium's process group %d still runs 5s after SIGKILL", pid)
}

// eval evaluates a JavaScript expression in the page and decodes its value.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript condition until it is true or timeout passes;
// it returns how long it took.
func waitFor(t *testing.T, ctx context.Context, what, expr string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if eval[bool](t, ctx, expr) {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not seen after %s (%s)\npage: %s", what, timeout, expr, pageText(t, ctx))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func pageText(t *testing.T, ctx context.Context) string {
	return eval[string](t, ctx, `document.body.innerText`)
}

// rows returns the text of each cell of each body row of a table.
func rows(t *testing.T, ctx context.Context, table string) [][]string {
	t.Helper()
	js := fmt.Sprintf(`JSON.stringify([...document.querySelectorAll(%q)].map(tr => [...tr.cells].map(c => c.textContent)))`, table+" tbody tr")
	var out [][]string
	if err := json.Unmarshal([]byte(eval[string](t, ctx, js)), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// screenshot writes the page at width×height to docs/<name> when
// WEFT_WEB_SCREENSHOTS is set: the viewport, or with full the whole page.
func screenshot(t *testing.T, ctx context.Context, name string, width, height int64, full bool) {
	t.Helper()
	if os.Getenv("WEFT_WEB_SCREENSHOTS") == "" {
		return
	}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height), chromedp.Sleep(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var b []byte
	var err error
	if full {
		b, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
	} else {
		b, err = chromedp.Run(ctx, chromedp.CaptureScreenshot())
	}
	if err != nil {
		t.Fatal(err)
	}
	p := nettest.ModuleRoot(t) + "/docs/" + name
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", p)
}

func contains(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
