package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/weft-net/weft/internal/testkit/kubecluster"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestInstallSettings renders what up installs, both ways (the kustomization
// of kube-weft.yml through `kubectl kustomize`, the chart through `helm
// template`; no cluster), and checks that -backend, -fast-path,
// -network-policy and -peer-filter land in net-conf.json and weftd's args, that the image
// is the one given everywhere, and that nothing is set when they are not.
func TestInstallSettings(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubeBin, err := kubetest.BinDir()
	if err != nil {
		nettest.CannotRun(t, nettest.SkipTools, err.Error())
	}
	helm, err := helmBin(root)
	if err != nil {
		nettest.CannotRun(t, nettest.SkipTools, err.Error())
	}
	const ref = "ghcr.io/weft-net/weft:kc-1"
	render := map[string]func(t *testing.T, o options) []byte{
		"manifest": func(t *testing.T, o options) []byte {
			manifest := filepath.Join(root, "kube-manifests", "kube-weft.yml")
			patches, err := manifestPatches(o, manifest)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := kubecluster.Kustomize(dir, manifest, ref, patches...); err != nil {
				t.Fatal(err)
			}
			return output(t, exec.Command(filepath.Join(kubeBin, "kubectl"), "kustomize", dir))
		},
		"helm": func(t *testing.T, o options) []byte {
			home := t.TempDir()
			cmd := exec.Command(helm, append([]string{"template", "weft", filepath.Join(root, "charts", "weft"),
				"--namespace", weftNamespace}, helmSets(o, ref)...)...)
			cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
			return output(t, cmd)
		},
	}
	for way, r := range render {
		t.Run(way+" defaults", func(t *testing.T) {
			be, args := installed(t, r(t, options{}), ref)
			if be["Type"] != "vxlan" || be["FastPath"] != nil {
				t.Errorf("Backend %v, want vxlan, FastPath unset", be)
			}
			if slices.ContainsFunc(args, func(a string) bool {
				return strings.HasPrefix(a, "--network-policy") || strings.HasPrefix(a, "--vxlan-peer-filter")
			}) {
				t.Errorf("weftd's args %q set --network-policy or --vxlan-peer-filter", args)
			}
		})
		t.Run(way+" settings", func(t *testing.T) {
			be, args := installed(t, r(t, options{Backend: "uvxlan", FastPath: "false", NetworkPolicy: "false", PeerFilter: "false"}), ref)
			if be["Type"] != "uvxlan" || be["FastPath"] != false {
				t.Errorf("Backend %v, want uvxlan, FastPath false", be)
			}
			if !slices.Contains(args, "--network-policy=false") || !slices.Contains(args, "--vxlan-peer-filter=false") || !slices.Contains(args, "--kube-subnet-mgr") {
				t.Errorf("weftd's args %q, want --kube-subnet-mgr, --network-policy=false and --vxlan-peer-filter=false", args)
			}
		})
	}
}

func output(t *testing.T, cmd *exec.Cmd) []byte {
	t.Helper()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, stderr.String())
	}
	return out
}

// installed reads rendered objects: net-conf.json's Backend and weftd's
// args, and checks that every container of the DaemonSet runs ref.
func installed(t *testing.T, objects []byte, ref string) (backend map[string]any, args []string) {
	t.Helper()
	var netConf string
	var ds *appsv1.DaemonSet
	for _, doc := range strings.Split(string(objects), "\n---\n") {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			t.Fatal(err)
		}
		switch kind.Kind {
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
				t.Fatal(err)
			}
			netConf = cm.Data["net-conf.json"]
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			if err := yaml.Unmarshal([]byte(doc), ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	var conf struct {
		Network string
		Backend map[string]any
	}
	if err := json.Unmarshal([]byte(netConf), &conf); err != nil {
		t.Fatalf("net-conf.json %q: %v", netConf, err)
	}
	if conf.Network != "10.244.0.0/16" {
		t.Errorf("net-conf.json's Network is %q", conf.Network)
	}
	if ds == nil {
		t.Fatal("no DaemonSet rendered")
	}
	spec := ds.Spec.Template.Spec
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Image != ref {
			t.Errorf("container %s runs %s, want %s", c.Name, c.Image, ref)
		}
		if c.Name == "weftd" {
			args = c.Args
		}
	}
	return conf.Backend, args
}
