package uvxlan

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestFastPathObjectsCurrent compiles bpf/fastpath.c as go generate does
// (the go:generate line of fastpath_bpf_linux.go), into a temporary
// directory, and fails when the objects or Go bindings differ from the
// committed ones: a change to the C source must come with regenerated
// objects.
func TestFastPathObjectsCurrent(t *testing.T) {
	for _, tool := range []string{"clang", "llvm-strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			nettest.CannotRun(t, nettest.SkipTools, "needs "+tool+" to compile bpf/fastpath.c (test/setup.sh installs it)")
		}
	}
	src, err := os.ReadFile("fastpath_bpf_linux.go")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, l := range strings.Split(string(src), "\n") {
		if rest, ok := strings.CutPrefix(l, "//go:generate "); ok {
			args = strings.Fields(rest)
		}
	}
	i := slices.Index(args, "github.com/cilium/ebpf/cmd/bpf2go")
	if i < 0 {
		t.Fatalf("no bpf2go go:generate line in fastpath_bpf_linux.go")
	}
	dir := t.TempDir()
	args = slices.Insert(args, i+1, "-output-dir", dir)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "GOPACKAGE=uvxlan", "GOFILE=fastpath_bpf_linux.go")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"fastpath_bpfeb.go", "fastpath_bpfeb.o", "fastpath_bpfel.go", "fastpath_bpfel.o"}
	var got []string
	for _, n := range names {
		got = append(got, filepath.Base(n))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("generated %v, want %v", got, want)
	}
	for _, n := range want {
		fresh, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("%s differs from what bpf/fastpath.c compiles to (%d bytes, committed %d): run go generate ./backend/uvxlan/... with test/setup.sh's clang and commit the result", n, len(fresh), len(committed))
		}
	}
}
