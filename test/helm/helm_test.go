// Package helm tests the Helm chart in charts/weft with the helm CLI that
// test/setup.sh builds (HELM_VERSION in test/versions.env): lint, the
// objects of its default values against kube-manifests/kube-weft.yml,
// Flannel's chart's values as they land in net-conf.json and the DaemonSet,
// the values it refuses, and install, upgrade, rollback and uninstall against
// a real kube-apiserver on loopback (internal/testkit/kubetest).
package helm

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// helm runs the helm CLI with its own configuration, cache and data
// directories (nothing of the user's is read or written) and no kubeconfig
// unless the arguments name one.
type helm struct {
	bin, home string
}

// newHelm finds helm where test/setup.sh builds it: WEFT_CACHE (default
// ~/.cache/weft)/helm-<HELM_VERSION>/helm.
func newHelm(t *testing.T) *helm {
	t.Helper()
	cache := os.Getenv("WEFT_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "weft")
	}
	version := ""
	b, err := os.ReadFile(filepath.Join(nettest.ModuleRoot(t), "test", "versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "HELM_VERSION="); ok {
			version = strings.TrimSpace(v)
		}
	}
	if version == "" {
		t.Fatal("test/versions.env has no HELM_VERSION")
	}
	p := filepath.Join(cache, "helm-"+version, "helm")
	if _, err := os.Stat(p); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "helm "+version+" is not built (test/setup.sh builds it into "+filepath.Dir(p)+")")
	}
	return &helm{bin: p, home: t.TempDir()}
}

// run runs helm and returns its standard output; the error holds its
// standard error.
func (h *helm) run(args ...string) (string, error) {
	cmd := exec.Command(h.bin, args...)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + h.home,
		"HELM_CACHE_HOME=" + filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(h.home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(h.home, "data"),
		"KUBECONFIG=" + filepath.Join(h.home, "no-kubeconfig"),
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.New(strings.TrimSpace(stderr.String()) + " (" + err.Error() + ")")
	}
	return stdout.String(), nil
}

// mustRun is run that fails t on error.
func (h *helm) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := h.run(args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// chartDir is the chart under test.
func chartDir(t *testing.T) string {
	return filepath.Join(nettest.ModuleRoot(t), "charts", "weft")
}

// valuesFile writes a values file and returns the arguments that pass it.
// Its path has no comma (helm splits -f at commas; t.TempDir's name holds
// the test's, which may have some).
func valuesFile(t *testing.T, values string) []string {
	t.Helper()
	if values == "" {
		return nil
	}
	f, err := os.CreateTemp("", "weft-helm-values-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	_, err = f.WriteString(values)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return []string{"-f", f.Name()}
}

// template renders the chart into namespace kube-weft with the given values
// (YAML) and returns the objects.
func (h *helm) template(t *testing.T, values string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", "weft", chartDir(t), "--namespace", "kube-weft"}, valuesFile(t, values)...)
	return decode(t, "helm template", h.mustRun(t, args...))
}

// decode reads every object of a YAML stream.
func decode(t *testing.T, what, stream string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode %s: %v", what, err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

// find converts the only object of kind into into.
func find(t *testing.T, objs []*unstructured.Unstructured, kind string, into any) {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(found), kind)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(found[0].Object, into); err != nil {
		t.Fatal(err)
	}
}
