package main

import (
	"bufio"
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

// weftNamespace is where kube-weft.yml puts weft, and where the chart is
// installed (its README's example).
const weftNamespace = "kube-weft"

// installWeft installs weft as o.Install says, once its image is built and
// imported, and waits until it runs on every node.
func installWeft(ctx context.Context, s *kubecluster.State, o options, kubeBin, root, ref, archive string, built func() error, log io.Writer) error {
	if err := built(); err != nil {
		return err
	}
	if err := s.ImportImage(ctx, archive); err != nil {
		return err
	}
	t0 := time.Now()
	var err error
	switch o.Install {
	case "", "manifest":
		err = applyManifest(ctx, s, o, kubeBin, filepath.Join(root, "kube-manifests", "kube-weft.yml"), ref)
	case "helm":
		err = helmInstall(ctx, s, o, kubeBin, root, ref)
	default:
		err = fmt.Errorf("-install %q: want manifest or helm", o.Install)
	}
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := s.WaitReady(wctx, weftNamespace, "weft"); err != nil {
		return err
	}
	fmt.Fprintf(log, "cluster: weft installed (%s%s), every node Ready in %s\n",
		cmpOr(o.Install, "manifest"), describe(o), time.Since(t0).Round(time.Second))
	return nil
}

// check refuses settings up cannot make, before anything is brought up.
func (o options) check() error {
	if o.CNI == "flannel" && (cmpOr(o.Install, "manifest") != "manifest" || o.FastPath != "" || o.NetworkPolicy != "" || o.PeerFilter != "") {
		return fmt.Errorf("-install, -fast-path, -network-policy and -peer-filter set weft's install; -cni flannel installs Flannel by its own manifest")
	}
	if o.Install != "" && o.Install != "manifest" && o.Install != "helm" {
		return fmt.Errorf("-install %q: want manifest or helm", o.Install)
	}
	for _, kv := range [][2]string{{"-fast-path", o.FastPath}, {"-network-policy", o.NetworkPolicy}, {"-peer-filter", o.PeerFilter}} {
		if kv[1] != "" && kv[1] != "true" && kv[1] != "false" {
			return fmt.Errorf("%s %q: want true or false", kv[0], kv[1])
		}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// describe says which settings up changed from weft's defaults.
func describe(o options) string {
	var d []string
	for _, kv := range [][2]string{{"backend", o.Backend}, {"fast path", o.FastPath}, {"network policy", o.NetworkPolicy}, {"VXLAN peer filter", o.PeerFilter}} {
		if kv[1] != "" {
			d = append(d, kv[0]+" "+kv[1])
		}
	}
	if len(d) == 0 {
		return ""
	}
	return "; " + strings.Join(d, ", ")
}

// applyManifest applies manifest through a kustomization that sets the
// image tag and makes o's settings (manifestPatches).
func applyManifest(ctx context.Context, s *kubecluster.State, o options, kubeBin, manifest, ref string) error {
	patches, err := manifestPatches(o, manifest)
	if err != nil {
		return err
	}
	return s.ApplyWithImage(ctx, kubeBin, manifest, ref, patches...)
}

// weftdArgs are the flags o adds to weftd's: --network-policy=false and
// --vxlan-peer-filter=false.
func (o options) weftdArgs() []string {
	var args []string
	if o.NetworkPolicy == "false" {
		args = append(args, "--network-policy=false")
	}
	if o.PeerFilter == "false" {
		args = append(args, "--vxlan-peer-filter=false")
	}
	return args
}

// manifestPatches returns, for each setting o changes, the patch a user
// would write: the net-conf.json of the manifest's ConfigMap with
// Backend.Type and Backend.FastPath set, and weftdArgs added to weftd's
// args.
func manifestPatches(o options, manifest string) ([]kubecluster.Patch, error) {
	var patches []kubecluster.Patch
	if o.Backend != "" || o.FastPath != "" {
		p, err := netConfPatch(manifest, o.Backend, o.FastPath)
		if err != nil {
			return nil, err
		}
		patches = append(patches, p)
	}
	for _, a := range o.weftdArgs() {
		patches = append(patches, kubecluster.Patch{Kind: "DaemonSet", Name: "weft",
			Patch: "- op: add\n  path: /spec/template/spec/containers/0/args/-\n  value: " + a + "\n"})
	}
	return patches, nil
}

// netConfPatch returns a patch of manifest's ConfigMap that holds
// net-conf.json, replacing it by the same JSON with Backend.Type set to
// backend (unless "") and Backend.FastPath to fastPath (unless "").
func netConfPatch(manifest, backend, fastPath string) (kubecluster.Patch, error) {
	b, err := os.ReadFile(manifest)
	if err != nil {
		return kubecluster.Patch{}, err
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var cm struct {
			Kind     string
			Metadata struct{ Name, Namespace string }
			Data     map[string]string
		}
		if yaml.Unmarshal([]byte(doc), &cm) != nil || cm.Kind != "ConfigMap" || cm.Data["net-conf.json"] == "" {
			continue
		}
		var conf map[string]any
		if err := json.Unmarshal([]byte(cm.Data["net-conf.json"]), &conf); err != nil {
			return kubecluster.Patch{}, fmt.Errorf("%s: net-conf.json: %w", manifest, err)
		}
		be, _ := conf["Backend"].(map[string]any)
		if be == nil {
			be = map[string]any{}
		}
		if backend != "" {
			be["Type"] = backend
		}
		switch fastPath {
		case "":
		case "true", "false":
			be["FastPath"] = fastPath == "true"
		default:
			return kubecluster.Patch{}, fmt.Errorf("-fast-path %q: want true or false", fastPath)
		}
		conf["Backend"] = be
		j, err := json.MarshalIndent(conf, "", "  ")
		if err != nil {
			return kubecluster.Patch{}, err
		}
		p, err := yaml.Marshal(map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]string{"name": cm.Metadata.Name, "namespace": cm.Metadata.Namespace},
			"data":     map[string]string{"net-conf.json": string(j) + "\n"},
		})
		if err != nil {
			return kubecluster.Patch{}, err
		}
		return kubecluster.Patch{Kind: "ConfigMap", Name: cm.Metadata.Name, Patch: string(p)}, nil
	}
	return kubecluster.Patch{}, fmt.Errorf("%s: no ConfigMap holds net-conf.json", manifest)
}

// helmInstall installs charts/weft as its README says: into the namespace
// kube-weft, created beforehand and labelled to admit privileged pods, with
// the image (and the settings o changes) given by --set.
func helmInstall(ctx context.Context, s *kubecluster.State, o options, kubeBin, root, ref string) error {
	helm, err := helmBin(root)
	if err != nil {
		return err
	}
	if _, err := s.Kubectl(ctx, kubeBin, "create", "namespace", weftNamespace); err != nil {
		return err
	}
	if _, err := s.Kubectl(ctx, kubeBin, "label", "namespace", weftNamespace, "pod-security.kubernetes.io/enforce=privileged"); err != nil {
		return err
	}
	args := append([]string{"install", "weft", filepath.Join(root, "charts", "weft"), "--namespace", weftNamespace,
		"--kubeconfig", s.Kubeconfig}, helmSets(o, ref)...)
	home := filepath.Join(s.Dir, "helm")
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// helmSets returns the chart's values a user sets for the image ref
// (repository:tag) and o's settings, as helm flags.
func helmSets(o options, ref string) []string {
	repo, tag, _ := strings.Cut(ref, ":")
	args := []string{"--set", "flannel.image.repository=" + repo, "--set-string", "flannel.image.tag=" + tag}
	if o.Backend != "" {
		args = append(args, "--set", "flannel.backend="+o.Backend)
	}
	if o.FastPath != "" {
		args = append(args, "--set", "flannel.fastPath="+o.FastPath)
	}
	if extra := o.weftdArgs(); len(extra) > 0 {
		args = append(args, "--set", "flannel.args={"+strings.Join(append([]string{"--kube-subnet-mgr"}, extra...), ",")+"}")
	}
	return args
}

// helmBin is the helm test/setup.sh builds: $WEFT_CACHE/helm-<HELM_VERSION
// of test/versions.env>/helm.
func helmBin(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "test", "versions.env"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "HELM_VERSION="); ok {
			bin := filepath.Join(cacheDir(), "helm-"+strings.TrimSpace(v), "helm")
			if _, err := os.Stat(bin); err != nil {
				return "", fmt.Errorf("no helm (test/setup.sh builds it): %w", err)
			}
			return bin, nil
		}
	}
	return "", errors.Join(errors.New("test/versions.env has no HELM_VERSION"), sc.Err())
}
