package runtimes

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// busyboxBin is Debian's busybox-static (test/setup.sh installs it).
const busyboxBin = "/bin/busybox"

// busyboxLayer returns a root file system tar: the static busybox with a
// symlink per applet under /bin, and an empty /tmp. Images are built
// from it locally; nothing is ever pulled.
func busyboxLayer(t *testing.T) []byte {
	t.Helper()
	bin, err := os.ReadFile(busyboxBin)
	if err != nil {
		t.Fatalf("busybox-static (test/setup.sh installs it): %v", err)
	}
	list, err := exec.Command(busyboxBin, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mod := time.Unix(0, 0)
	dir := func(name string, mode int64) {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: mod})
	}
	dir("bin/", 0o755)
	dir("tmp/", 0o1777)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: mod})
	tw.Write(bin)
	for _, a := range strings.Fields(string(list)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: mod})
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
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
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "pause", Mode: 0o755, Size: int64(len(bin)), ModTime: time.Unix(0, 0)})
	tw.Write(bin)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// ociArchive writes an OCI image layout archive (as `ctr images import`
// reads it) of one uncompressed layer, named name, and returns its path.
func ociArchive(t *testing.T, name string, layer []byte, entrypoint []string) string {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	put := func(path string, data []byte) {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0)})
		tw.Write(data)
	}
	blob := func(mediaType string, data []byte) map[string]any {
		sum := sha256.Sum256(data)
		d := "sha256:" + hex.EncodeToString(sum[:])
		put("blobs/sha256/"+hex.EncodeToString(sum[:]), data)
		return map[string]any{"mediaType": mediaType, "digest": d, "size": len(data)}
	}
	layerDesc := blob("application/vnd.oci.image.layer.v1.tar", layer)
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": entrypoint, "Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []any{layerDesc["digest"]}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": blob("application/vnd.oci.image.config.v1+json", config),
		"layers": []any{layerDesc},
	})
	md := blob("application/vnd.oci.image.manifest.v1+json", manifest)
	md["annotations"] = map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:]}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{md}})
	put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	put("index.json", index)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(path, tb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
