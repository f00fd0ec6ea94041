package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/weft-net/weft/internal/testkit/kubecluster"
)

// Flannel's manifest, as its users apply it: the DaemonSet kube-flannel-ds
// in the namespace kube-flannel, configured by the ConfigMap
// kube-flannel-cfg.
const (
	flannelNS        = "kube-flannel"
	flannelDaemonSet = "kube-flannel-ds"
	flannelConfigMap = "kube-flannel-cfg"
	// flannelCNIVersion is the conflist's cniVersion: the Flannel CNI
	// plugin built here (test/cluster/flannel-images.sh) predates CNI 1.0.
	flannelCNIVersion = "0.4.0"
)

// flannelBackends are the -backend values for -cni flannel.
var flannelBackends = []string{"vxlan", "host-gw", "wireguard"}

// image is an image archive and the reference it holds.
type image struct{ Ref, Archive string }

// buildFlannelImages builds (or finds in the cache) the images Flannel's
// manifest runs, with test/cluster/flannel-images.sh.
func buildFlannelImages(ctx context.Context, root string, log io.Writer) ([]image, error) {
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "test", "cluster", "flannel-images.sh"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("build Flannel's images: %w:\n%s", err, stderr.String())
	}
	var imgs []image
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		ref, archive, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			return nil, fmt.Errorf("flannel-images.sh printed %q: want IMAGE ARCHIVE", sc.Text())
		}
		imgs = append(imgs, image{ref, archive})
	}
	if len(imgs) != 2 {
		return nil, fmt.Errorf("flannel-images.sh printed %d images, want 2", len(imgs))
	}
	fmt.Fprintf(log, "cluster: Flannel's images ready in %s\n", time.Since(t0).Round(time.Second))
	return imgs, nil
}

// flannelManifest is the path of Flannel's kube-flannel.yml at
// FLANNEL_VERSION (test/versions.env) in the Go module cache, downloaded
// from the module proxy when missing.
func flannelManifest(ctx context.Context, root string) (string, error) {
	version, err := versionsEnv(root, "FLANNEL_VERSION")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", "github.com/flannel-io/flannel@"+version)
	cmd.Dir = "/" // outside weft's module
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); jerr != nil || mod.Error != "" || mod.Dir == "" {
		return "", fmt.Errorf("go mod download github.com/flannel-io/flannel@%s: %v %s", version, errors.Join(err, jerr), mod.Error)
	}
	return filepath.Join(mod.Dir, "Documentation", "kube-flannel.yml"), nil
}

// versionsEnv reads key's value from test/versions.env.
func versionsEnv(root, key string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "test", "versions.env"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return strings.Trim(v, `"`), nil
		}
	}
	return "", fmt.Errorf("test/versions.env has no %s", key)
}

// flannelConfig returns the data of the manifest's ConfigMap
// kube-flannel-cfg as this cluster needs it: net-conf.json's Network set to
// the cluster's pod network and its Backend to backend, and cni-conf.json
// naming flannelCNIVersion. Every other field stays as the manifest has it.
func flannelConfig(manifest []byte, backend string) (map[string]string, error) {
	var cm struct {
		Kind     string
		Metadata struct{ Name string }
		Data     map[string]string
	}
	for _, doc := range strings.Split(string(manifest), "\n---\n") {
		cm.Kind = ""
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
			return nil, fmt.Errorf("kube-flannel.yml: %w", err)
		}
		if cm.Kind == "ConfigMap" && cm.Metadata.Name == flannelConfigMap {
			break
		}
	}
	if cm.Kind != "ConfigMap" {
		return nil, fmt.Errorf("kube-flannel.yml has no ConfigMap %s", flannelConfigMap)
	}
	net, err := setJSON(cm.Data["net-conf.json"], map[string]any{
		"Network": kubecluster.ClusterCIDR, "Backend": map[string]any{"Type": backend}})
	if err != nil {
		return nil, fmt.Errorf("net-conf.json: %w", err)
	}
	cni, err := setJSON(cm.Data["cni-conf.json"], map[string]any{"cniVersion": flannelCNIVersion})
	if err != nil {
		return nil, fmt.Errorf("cni-conf.json: %w", err)
	}
	return map[string]string{"net-conf.json": net, "cni-conf.json": cni}, nil
}

// setJSON sets top-level fields of the JSON object doc.
func setJSON(doc string, fields map[string]any) (string, error) {
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		return "", err
	}
	for k, v := range fields {
		m[k] = v
	}
	b, err := json.MarshalIndent(m, "", "  ")
	return string(b) + "\n", err
}

// installFlannel installs Flannel as its users do: kubectl apply -k of a
// kustomization over Flannel's own kube-flannel.yml that replaces only the
// images (by those built here, imported into every node) and the
// ConfigMap's data (flannelConfig); then it waits until every node is
// Ready and Flannel runs on each.
func installFlannel(ctx context.Context, s *kubecluster.State, kubeBin, root, backend string, built func() ([]image, error), log io.Writer) error {
	imgs, err := built()
	if err != nil {
		return err
	}
	for _, img := range imgs {
		if err := s.ImportImage(ctx, img.Archive); err != nil {
			return err
		}
	}
	manifest, err := flannelManifest(ctx, root)
	if err != nil {
		return err
	}
	dir, err := flannelKustomization(filepath.Join(s.Dir, "kustomize", "kube-flannel"), manifest, backend, imgs)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := s.Kubectl(ctx, kubeBin, "apply", "-k", dir); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := s.WaitReady(wctx, flannelNS, flannelDaemonSet); err != nil {
		out, _ := s.Kubectl(ctx, kubeBin, "-n", flannelNS, "logs", "ds/"+flannelDaemonSet, "--tail=5")
		return fmt.Errorf("%w; the log of one of Flannel's pods ends:\n%s", err, out)
	}
	fmt.Fprintf(log, "cluster: Flannel (%s) applied, every node Ready in %s\n", backend, time.Since(t0).Round(time.Second))
	return nil
}

type imagesOrErr struct {
	images []image
	err    error
}

// flannelKustomization writes into dir a copy of the manifest and a
// kustomization of it: the images' new names and tags and a patch of the
// ConfigMap. It returns dir.
func flannelKustomization(dir, manifest, backend string, imgs []image) (string, error) {
	m, err := os.ReadFile(manifest)
	if err != nil {
		return "", err
	}
	data, err := flannelConfig(m, backend)
	if err != nil {
		return "", err
	}
	patch, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]string{"name": flannelConfigMap, "namespace": flannelNS}, "data": data})
	if err != nil {
		return "", err
	}
	var k strings.Builder
	k.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - kube-flannel.yml\npatches:\n  - path: kube-flannel-cfg.json\nimages:\n")
	for _, img := range imgs {
		repo, tag, ok := strings.Cut(img.Ref, ":")
		if !ok {
			return "", fmt.Errorf("image %q: want repository:tag", img.Ref)
		}
		fmt.Fprintf(&k, "  - name: %s\n    newTag: %q\n", repo, tag)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for name, b := range map[string][]byte{"kube-flannel.yml": m, "kube-flannel-cfg.json": patch, "kustomization.yaml": []byte(k.String())} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}
