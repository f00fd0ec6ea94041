package nettest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// ModuleRoot returns the directory of weft's go.mod.
func ModuleRoot(tb testing.TB) string {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

var (
	buildMu   sync.Mutex
	buildDir  string
	builtBins = map[string]string{}
)

// Binary builds one of weft's commands ("weftd", "weft", "weftctl") once per
// test process and returns the path of the executable.
func Binary(tb testing.TB, name string) string {
	tb.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := builtBins[name]; ok {
		return p
	}
	if buildDir == "" {
		d, err := os.MkdirTemp("", "weft-bin-")
		if err != nil {
			tb.Fatal(err)
		}
		buildDir = d // removed with the machine's tmp; shared by all tests of the process
	}
	out := filepath.Join(buildDir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = ModuleRoot(tb)
	// Static, as the image and the README build them: the tests and
	// benchmarks run the binaries users run.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./cmd/%s: %v\n%s", name, err, b)
	}
	builtBins[name] = out
	return out
}

// ReferencePlugins returns the directory holding the reference CNI plugins
// (bridge, host-local, portmap, loopback) that test/run.sh installs, named by
// WEFT_CNI_BIN. A missing directory fails the test: it is a broken setup.
func ReferencePlugins(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("WEFT_CNI_BIN")
	if dir == "" {
		tb.Fatal("WEFT_CNI_BIN is not set: run the tests through test/run.sh, which installs the reference CNI plugins")
	}
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			tb.Fatalf("reference CNI plugin %s missing in WEFT_CNI_BIN=%s: %v", p, dir, err)
		}
	}
	return dir
}
