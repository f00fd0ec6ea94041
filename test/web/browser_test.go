package web

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// browser starts a headless Chromium with a fresh profile and returns a
// tab's context. The flags keep it off the network: no background
// requests, no component or sync updates, no QUIC.
func browser(t *testing.T, width, height int) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "Debian's chromium is needed to check the page in a browser: apt-get install -y chromium (test/setup.sh installs it)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
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
