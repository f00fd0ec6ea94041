package kubecluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kubectl runs the kubectl of kubeBin against the cluster as the admin and
// returns its combined output.
func (s *State) Kubectl(ctx context.Context, kubeBin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(kubeBin, "kubectl"), append([]string{"--kubeconfig", s.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubecluster: kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Patch is a kustomize patch, a strategic merge patch or a JSON 6902 patch
// (in YAML), of the object of kind Kind named Name.
type Patch struct {
	Kind, Name, Patch string
}

// ApplyWithImage applies manifest as a user who loaded the image ref
// (repository:tag) into the nodes would: through a kustomization that
// sets the tag of every image of that repository, applies patches and
// changes nothing else. With a tag other than "latest", kubelet's default
// pull policy is IfNotPresent, so the imported image is used and nothing
// is pulled.
func (s *State) ApplyWithImage(ctx context.Context, kubeBin, manifest, ref string, patches ...Patch) error {
	dir := filepath.Join(s.Dir, "kustomize", strings.TrimSuffix(filepath.Base(manifest), filepath.Ext(manifest)))
	if err := Kustomize(dir, manifest, ref, patches...); err != nil {
		return err
	}
	_, err := s.Kubectl(ctx, kubeBin, "apply", "-k", dir)
	return err
}

// Kustomize writes into dir the kustomization ApplyWithImage applies: a
// copy of manifest, the image tag of ref and the patches.
func Kustomize(dir, manifest, ref string, patches ...Patch) error {
	repo, tag, ok := strings.Cut(ref, ":")
	if !ok || strings.Contains(tag, "/") {
		return fmt.Errorf("kubecluster: image %q: want repository:tag", ref)
	}
	if err := copyFile(manifest, filepath.Join(dir, filepath.Base(manifest)), 0o644); err != nil {
		return err
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\nimages:\n  - name: %s\n    newTag: %q\n",
		filepath.Base(manifest), repo, tag)
	if len(patches) > 0 {
		k += "patches:\n"
	}
	for i, p := range patches {
		name := fmt.Sprintf("patch-%d.yaml", i)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(p.Patch), 0o644); err != nil {
			return fmt.Errorf("kubecluster: %w", err)
		}
		k += fmt.Sprintf("  - path: %s\n    target:\n      kind: %s\n      name: %s\n", name, p.Kind, p.Name)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	return nil
}

// ImportImage imports an image archive into every node's containerd.
func (s *State) ImportImage(ctx context.Context, archive string) error {
	for i := range s.Nodes {
		if err := s.Nodes[i].ImportImage(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

// WaitReady waits until every node is Ready and the DaemonSet ns/name has
// a ready pod on each.
func (s *State) WaitReady(ctx context.Context, ns, daemonSet string) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	var last string
	for {
		last = s.readiness(ctx, c.CoreV1().Nodes().List, func() (*appsv1.DaemonSet, error) {
			return c.AppsV1().DaemonSets(ns).Get(ctx, daemonSet, metav1.GetOptions{})
		})
		if last == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubecluster: cluster not ready: %s", last)
		case <-time.After(time.Second):
		}
	}
}

// readiness says what is not ready yet ("" when all is).
func (s *State) readiness(ctx context.Context,
	nodes func(context.Context, metav1.ListOptions) (*corev1.NodeList, error),
	ds func() (*appsv1.DaemonSet, error)) string {
	list, err := nodes(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	if len(list.Items) != len(s.Nodes) {
		return fmt.Sprintf("%d of %d nodes registered", len(list.Items), len(s.Nodes))
	}
	for _, n := range list.Items {
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = c.Status == corev1.ConditionTrue
				if !ready {
					return fmt.Sprintf("node %s not Ready: %s", n.Name, c.Message)
				}
			}
		}
		if !ready {
			return "node " + n.Name + " has no Ready condition"
		}
	}
	d, err := ds()
	if err != nil {
		return err.Error()
	}
	if int(d.Status.NumberReady) != len(s.Nodes) || d.Status.UpdatedNumberScheduled != d.Status.DesiredNumberScheduled {
		return fmt.Sprintf("DaemonSet %s: %d of %d pods ready", d.Name, d.Status.NumberReady, len(s.Nodes))
	}
	return ""
}
