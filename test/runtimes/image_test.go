package runtimes

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/weft-net/weft/internal/testkit/ociimage"
)

// busyboxLayer returns a root file system tar: the static busybox with a
// symlink per applet under /bin, and an empty /tmp. Images are built
// from it locally; nothing is ever pulled.
func busyboxLayer(t *testing.T) []byte {
	t.Helper()
	b, err := ociimage.BusyboxLayer()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pauseLayer builds testdata/pause as a static binary and returns a root
// file system tar holding it as /pause.
func pauseLayer(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./testdata/pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, b)
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ociimage.Layer(ociimage.File{Name: "pause", Mode: 0o755, Data: bin})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ociArchive writes an OCI image layout archive (as `ctr images import`
// reads it) of one uncompressed layer, named name, and returns its path.
func ociArchive(t *testing.T, name string, layer []byte, entrypoint []string) string {
	t.Helper()
	b, err := ociimage.Archive(name, layer, entrypoint)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
