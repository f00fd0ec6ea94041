package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/testkit/kubecluster"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/ociimage"
)

const (
	benchNS    = "weft-bench"
	iperfImage = "weft.test/bench/iperf3:bookworm"
	iperfPort  = 5201
	rrPort     = 7000
)

// iperfArchive is where test/cluster/images.sh iperf3 leaves the image.
func iperfArchive() string {
	c := os.Getenv("WEFT_CACHE")
	if c == "" {
		home, _ := os.UserHomeDir()
		c = filepath.Join(home, ".cache", "weft")
	}
	return filepath.Join(c, "images-"+kubetest.Version, "bench", "iperf3.tar")
}

// buildRR builds rr statically into dir and writes an image archive of it;
// it returns the binary, the archive and the image's name (tagged with the
// binary's digest, so that a changed rr is a new image).
func buildRR(root, dir string) (bin, archive, ref string, err error) {
	bin = filepath.Join(dir, "rr")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./bench/cluster/rr")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", "", fmt.Errorf("build rr: %w: %s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return "", "", "", err
	}
	sum := sha256.Sum256(b)
	ref = "weft.test/bench/rr:" + hex.EncodeToString(sum[:6])
	layer, err := ociimage.Layer(ociimage.File{Name: "rr", Mode: 0o755, Data: b})
	if err != nil {
		return "", "", "", err
	}
	arch, err := ociimage.Archive(ref, layer, []string{"/rr"})
	if err != nil {
		return "", "", "", err
	}
	archive = filepath.Join(dir, "rr.tar")
	return bin, archive, ref, os.WriteFile(archive, arch, 0o644)
}

// podsYAML is the bench's namespace, the server pod on the first node, the
// client pod on the second and the server's ClusterIP Service. Nothing is
// ever pulled. The containers request CPU so that the pods' cgroups weigh
// (cpu.shares) about as much as the node's own processes do: best-effort
// pods would get a share of 2 and lose every contention on a busy machine.
func podsYAML(server, client, rrRef string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: Pod
metadata: {name: srv, namespace: %[1]s, labels: {app: weft-bench-srv}}
spec:
  nodeName: %[2]s
  terminationGracePeriodSeconds: 1
  containers:
  - {name: iperf3, image: %[4]s, imagePullPolicy: Never, args: ["-s"], resources: {requests: {cpu: 700m}}}
  - {name: rr, image: %[5]s, imagePullPolicy: Never, args: ["server", "-addr", ":%[7]d"], resources: {requests: {cpu: 700m}}}
---
apiVersion: v1
kind: Pod
metadata: {name: cli, namespace: %[1]s}
spec:
  nodeName: %[3]s
  terminationGracePeriodSeconds: 1
  containers:
  - {name: iperf3, image: %[4]s, imagePullPolicy: Never, command: ["sleep", "infinity"], resources: {requests: {cpu: 700m}}}
  - {name: rr, image: %[5]s, imagePullPolicy: Never, args: ["idle"], resources: {requests: {cpu: 700m}}}
---
apiVersion: v1
kind: Service
metadata: {name: srv, namespace: %[1]s}
spec:
  selector: {app: weft-bench-srv}
  ports:
  - {name: iperf3, protocol: TCP, port: %[6]d}
  - {name: iperf3-udp, protocol: UDP, port: %[6]d}
  - {name: rr, protocol: TCP, port: %[7]d}
`, benchNS, server, client, iperfImage, rrRef, iperfPort, rrPort)
}

// pauseArchive is test/cluster/images.sh's sandbox image, which up
// imported too: kubelet's image garbage collection removes it when the
// machine's disk fills past its threshold, and the next pod cannot start.
func pauseArchive() string {
	return filepath.Join(filepath.Dir(filepath.Dir(iperfArchive())), "pause.tar")
}

// deploy imports the images into s's nodes (the sandbox image again, when
// images.sh built it), starts the bench's pods and returns the server
// pod's address and the Service's.
func deploy(ctx context.Context, s *kubecluster.State, kubeBin, dir, rrArchive, rrRef string) (podIP, svcIP string, err error) {
	archives := []string{iperfArchive(), rrArchive}
	if _, err := os.Stat(pauseArchive()); err == nil {
		archives = append(archives, pauseArchive())
	}
	for _, a := range archives {
		if err := s.ImportImage(ctx, a); err != nil {
			return "", "", err
		}
	}
	if len(s.Nodes) < 2 {
		return "", "", fmt.Errorf("cluster %s has %d nodes, the bench needs 2", s.Dir, len(s.Nodes))
	}
	f := filepath.Join(dir, "pods-"+filepath.Base(s.Dir)+".yml")
	if err := os.WriteFile(f, []byte(podsYAML(s.Nodes[0].Name, s.Nodes[1].Name, rrRef)), 0o644); err != nil {
		return "", "", err
	}
	if _, err := s.Kubectl(ctx, kubeBin, "apply", "-f", f); err != nil {
		return "", "", err
	}
	if _, err := s.Kubectl(ctx, kubeBin, "-n", benchNS, "wait", "--for=condition=Ready", "pod/srv", "pod/cli", "--timeout=3m"); err != nil {
		return "", "", err
	}
	if podIP, err = s.Kubectl(ctx, kubeBin, "-n", benchNS, "get", "pod", "srv", "-o", "jsonpath={.status.podIP}"); err != nil {
		return "", "", err
	}
	if svcIP, err = s.Kubectl(ctx, kubeBin, "-n", benchNS, "get", "service", "srv", "-o", "jsonpath={.spec.clusterIP}"); err != nil {
		return "", "", err
	}
	return strings.TrimSpace(podIP), strings.TrimSpace(svcIP), nil
}

// undeploy deletes the bench's namespace (and so its pods and Service).
func undeploy(s *kubecluster.State, kubeBin string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := s.Kubectl(ctx, kubeBin, "delete", "namespace", benchNS, "--wait=true", "--timeout=90s")
	return err
}

// cniPods are the node cgroups' paths (relative to a hierarchy) of the
// CNI's DaemonSet pods on s's first two nodes: weft's (kube-weft) or
// Flannel's (kube-flannel).
func cniPods(ctx context.Context, s *kubecluster.State, kubeBin string) (string, []string, error) {
	for _, ns := range []string{"kube-weft", "kube-flannel"} {
		out, err := s.Kubectl(ctx, kubeBin, "-n", ns, "get", "pods", "-o",
			`jsonpath={range .items[*]}{.metadata.uid} {.spec.nodeName} {.metadata.name}{"\n"}{end}`)
		if err != nil || strings.TrimSpace(out) == "" {
			continue
		}
		var cgs []string
		for _, n := range s.Nodes[:2] {
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(l)
				if len(f) == 3 && f[1] == n.Name {
					cg, err := podCgroup(n.Cgroup, f[0])
					if err != nil {
						return "", nil, fmt.Errorf("%s/%s: %w", ns, f[2], err)
					}
					cgs = append(cgs, cg)
				}
			}
		}
		if len(cgs) != 2 {
			return "", nil, fmt.Errorf("%s: found the pods of %d of the 2 nodes", ns, len(cgs))
		}
		return ns, cgs, nil
	}
	return "", nil, fmt.Errorf("cluster %s: no pod in kube-weft or kube-flannel", s.Dir)
}
