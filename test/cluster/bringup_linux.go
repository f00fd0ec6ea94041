package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weft-net/weft/internal/testkit/kubecluster"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/ociimage"
)

// defaultDir holds a cluster's state unless WEFT_CLUSTER_DIR says
// otherwise (on disk: each node's containerd keeps its images there).
const defaultDir = "/var/tmp/weft-cluster"

// SandboxImage is the pause image the e2e suite of kubetest.Version names;
// up builds a minimal one under that name.
const sandboxImage = "registry.k8s.io/pause:3.10.2"

// defaultName names the cluster unless WEFT_CLUSTER_NAME says otherwise
// (clusters of different names and directories run side by side).
const defaultName = "dev"

func clusterName() string {
	if n := os.Getenv("WEFT_CLUSTER_NAME"); n != "" {
		return n
	}
	return defaultName
}

func stateDir() string {
	if d := os.Getenv("WEFT_CLUSTER_DIR"); d != "" {
		return d
	}
	return defaultDir
}

type options struct {
	// DNSOnly imports of the e2e suite's images only CoreDNS's (the
	// test's pods run an image of their own).
	DNSOnly   bool
	Name      string
	Dir       string
	Nodes     int
	ProxyMode string
	// CNI is the pod network to install: "weft" (the default) or
	// "flannel" (Flannel's own manifest, flannel_linux.go).
	CNI string
	// Backend is Backend.Type in the CNI's net-conf.json ("" keeps the
	// manifest's). How weft is installed, each as a user sets it
	// (install_linux.go): Install is "manifest" (default) or "helm";
	// FastPath, NetworkPolicy and PeerFilter (weftd's
	// --vxlan-peer-filter) are "true", "false" or "" (unset: weft's
	// default).
	Backend, Install, FastPath, NetworkPolicy, PeerFilter string
}

// bringUp builds the images, brings the cluster up and installs the pod
// network (weft or Flannel) by its manifest; progress goes to log. On failure the cluster is down.
func bringUp(ctx context.Context, o options, log io.Writer) (*kubecluster.State, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	kubeBin, err := kubetest.BinDir()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "weft-cluster-images.")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// The pod network's images build (a few minutes cold) while the
	// cluster comes up.
	install, wait, err := startCNI(ctx, o, root, kubeBin, tmp, log)
	if err != nil {
		return nil, err
	}
	images, err := localImages(root, tmp, o.DNSOnly)
	if err != nil {
		return nil, errors.Join(err, wait())
	}
	cfg := kubecluster.Config{
		Name: o.Name, Dir: o.Dir, Nodes: o.Nodes, ProxyMode: o.ProxyMode, KubeBin: kubeBin,
		CNIBin: cniBin(), SandboxImage: sandboxImage, Images: images,
	}
	t0 := time.Now()
	s, err := kubecluster.Up(ctx, cfg)
	if err != nil {
		return nil, errors.Join(err, wait())
	}
	fmt.Fprintf(log, "cluster: control plane and %d nodes up in %s\n", o.Nodes, time.Since(t0).Round(time.Second))
	if err := install(s); err != nil {
		return nil, errors.Join(err, kubecluster.Down(o.Dir))
	}
	if err := installDNS(ctx, s, kubeBin, root, log); err != nil {
		return nil, errors.Join(err, kubecluster.Down(o.Dir))
	}
	return s, nil
}

// corednsArchive is where test/cluster/images.sh leaves CoreDNS's image.
func corednsArchive() string {
	return filepath.Join(cacheDir(), "images-"+kubetest.Version, "coredns.tar")
}

// installDNS deploys CoreDNS (test/cluster/coredns.yml) when its image has
// been built (and so imported by Up), and waits until it is available.
func installDNS(ctx context.Context, s *kubecluster.State, kubeBin, root string, log io.Writer) error {
	if _, err := os.Stat(corednsArchive()); err != nil {
		fmt.Fprintf(log, "cluster: no cluster DNS: %s is missing (test/cluster/images.sh builds it)\n", corednsArchive())
		return nil
	}
	t0 := time.Now()
	if _, err := s.Kubectl(ctx, kubeBin, "apply", "-f", filepath.Join(root, "test", "cluster", "coredns.yml")); err != nil {
		return err
	}
	if _, err := s.Kubectl(ctx, kubeBin, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=3m"); err != nil {
		return err
	}
	fmt.Fprintf(log, "cluster: CoreDNS available in %s\n", time.Since(t0).Round(time.Second))
	return nil
}

// startCNI starts building the images of the pod network o names and
// returns the function that installs it on the cluster once it is up, and
// the one that waits for the build (and returns its error).
func startCNI(ctx context.Context, o options, root, kubeBin, tmp string, log io.Writer) (install func(*kubecluster.State) error, wait func() error, err error) {
	switch o.CNI {
	case "", "weft":
		ref := fmt.Sprintf("ghcr.io/weft-net/weft:kc-%d", time.Now().Unix())
		archive := filepath.Join(tmp, "weft.tar")
		built := make(chan error, 1)
		go func() { built <- buildWeftImage(ctx, root, ref, archive, log) }()
		wait = sync.OnceValue(func() error { return <-built })
		install = func(s *kubecluster.State) error {
			return installWeft(ctx, s, o, kubeBin, root, ref, archive, wait, log)
		}
		return install, wait, nil
	case "flannel":
		backend := cmp.Or(o.Backend, "vxlan")
		if !slices.Contains(flannelBackends, backend) {
			return nil, nil, fmt.Errorf("-backend %s: Flannel's backends here are %v", backend, flannelBackends)
		}
		built := make(chan imagesOrErr, 1)
		go func() {
			imgs, err := buildFlannelImages(ctx, root, log)
			built <- imagesOrErr{imgs, err}
		}()
		images := sync.OnceValues(func() ([]image, error) { r := <-built; return r.images, r.err })
		install = func(s *kubecluster.State) error {
			return installFlannel(ctx, s, kubeBin, root, backend, images, log)
		}
		wait = func() error { _, err := images(); return err }
		return install, wait, nil
	}
	return nil, nil, fmt.Errorf("-cni %s: want weft or flannel", o.CNI)
}

// buildWeftImage builds weft's image from the Dockerfile with
// test/image/build.sh and saves it to archive as ref.
func buildWeftImage(ctx context.Context, root, ref, archive string, log io.Writer) error {
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "test", "image", "build.sh"))
	cmd.Env = append(os.Environ(), "WEFT_IMAGE_SAVE="+archive, "WEFT_IMAGE_NAME="+ref)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build weft's image: %w:\n%s", err, out.String())
	}
	fmt.Fprintf(log, "cluster: weft's image %s built in %s\n", ref, time.Since(t0).Round(time.Second))
	return nil
}

// localImages writes the pause image the sandboxes run (a static Go
// pause, test/runtimes/testdata/pause) into dir and returns it, followed
// by every archive in $WEFT_CACHE/images-<version>/ (the e2e suite's
// images, when they have been built there), which may replace it, or only
// CoreDNS's with dnsOnly.
func localImages(root, dir string, dnsOnly bool) ([]string, error) {
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./test/runtimes/testdata/pause")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build pause: %w: %s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layer, err := ociimage.Layer(ociimage.File{Name: "pause", Mode: 0o755, Data: b})
	if err != nil {
		return nil, err
	}
	arch, err := ociimage.Archive(sandboxImage, layer, []string{"/pause"})
	if err != nil {
		return nil, err
	}
	pause := filepath.Join(dir, "pause.tar")
	if err := os.WriteFile(pause, arch, 0o644); err != nil {
		return nil, err
	}
	if dnsOnly {
		if _, err := os.Stat(corednsArchive()); err != nil {
			return []string{pause}, nil
		}
		return []string{pause, corednsArchive()}, nil
	}
	more, _ := filepath.Glob(filepath.Join(cacheDir(), "images-"+kubetest.Version, "*.tar"))
	return append([]string{pause}, more...), nil
}

func cacheDir() string {
	if c := os.Getenv("WEFT_CACHE"); c != "" {
		return c
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "weft")
}

// cniBin is where the standard CNI plugins are: $WEFT_CNI_BIN (test/run.sh
// sets it) or Debian's containernetworking-plugins.
func cniBin() string {
	if d := os.Getenv("WEFT_CNI_BIN"); d != "" {
		return d
	}
	return "/usr/lib/cni"
}

// moduleRoot finds weft's module root from the working directory up.
func moduleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/weft-net/weft\n") {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("not inside weft's module")
		}
		d = parent
	}
}
