// Package ociimage writes small container images for tests as OCI image
// layout archives (what `ctr images import` reads): one uncompressed layer
// built here, from static binaries, so that nothing is ever pulled.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// BusyboxBin is Debian's busybox-static (test/setup.sh installs it).
const BusyboxBin = "/bin/busybox"

// File is one regular file of a layer.
type File struct {
	Name string // path inside the image, without a leading slash
	Mode int64
	Data []byte
}

// Layer returns a root file system tar holding files.
func Layer(files ...File) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.Name, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("ociimage: %w", err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, fmt.Errorf("ociimage: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	return b.Bytes(), nil
}

// BusyboxLayer returns a root file system tar: the static busybox with a
// symlink per applet under /bin, an empty /tmp, and the extra files.
func BusyboxLayer(extra ...File) ([]byte, error) {
	bin, err := os.ReadFile(BusyboxBin)
	if err != nil {
		return nil, fmt.Errorf("ociimage: busybox-static (test/setup.sh installs it): %w", err)
	}
	list, err := exec.Command(BusyboxBin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("ociimage: busybox --list: %w", err)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mod := time.Unix(0, 0)
	hdrs := []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755, ModTime: mod},
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: mod},
	}
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("ociimage: %w", err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: mod}); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	for _, a := range strings.Fields(string(list)) {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: mod}); err != nil {
			return nil, fmt.Errorf("ociimage: %w", err)
		}
	}
	for _, f := range extra {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Name, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: mod}); err != nil {
			return nil, fmt.Errorf("ociimage: %w", err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, fmt.Errorf("ociimage: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	return b.Bytes(), nil
}

// Archive returns an OCI image layout archive of one uncompressed layer,
// named name (registry/repository:tag), for linux/amd64.
func Archive(name string, layer []byte, entrypoint []string) ([]byte, error) {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	var werr error
	put := func(path string, data []byte) {
		if werr == nil {
			werr = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0)})
		}
		if werr == nil {
			_, werr = tw.Write(data)
		}
	}
	blob := func(mediaType string, data []byte) map[string]any {
		sum := sha256.Sum256(data)
		put("blobs/sha256/"+hex.EncodeToString(sum[:]), data)
		return map[string]any{"mediaType": mediaType, "digest": "sha256:" + hex.EncodeToString(sum[:]), "size": len(data)}
	}
	layerDesc := blob("application/vnd.oci.image.layer.v1.tar", layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": entrypoint, "Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []any{layerDesc["digest"]}},
	})
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": blob("application/vnd.oci.image.config.v1+json", config),
		"layers": []any{layerDesc},
	})
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	md := blob("application/vnd.oci.image.manifest.v1+json", manifest)
	md["annotations"] = map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:]}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{md}})
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	put("index.json", index)
	if werr != nil {
		return nil, fmt.Errorf("ociimage: %w", werr)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	return tb.Bytes(), nil
}
