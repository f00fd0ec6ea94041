package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// wireguardDualStack is a values file in Flannel's names: every WireGuard
// setting, dual-stack.
const wireguardDualStack = `
podCidr: 10.42.0.0/16
podCidrv6: fd00:42::/56
flannel:
  backend: wireguard
  backendPort: 51830
  backendPortv6: 51831
  mtu: 1420
  psk: "aGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8gd28="
  tunnelMode: auto
  keepaliveInterval: 25
`

func TestLint(t *testing.T) {
	h := newHelm(t)
	for name, values := range map[string]string{
		"defaults":                      "",
		"wireguard dual-stack":          wireguardDualStack,
		"host-gw IPv6 only":             "podCidr: \"\"\npodCidrv6: fd00:42::/56\nflannel: {backend: host-gw}\n",
		"no conflist, no health server": "flannel: {skipCNIConfigInstallation: true, healthz: {port: 0}}\n",
	} {
		t.Run(name, func(t *testing.T) {
			out := h.mustRun(t, append([]string{"lint", "--strict", chartDir(t)}, valuesFile(t, values)...)...)
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Errorf("helm lint --strict:\n%s", out)
			}
		})
	}
}

// readManifest decodes kube-manifests/kube-weft.yml.
func readManifest(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	p := filepath.Join(nettest.ModuleRoot(t), "kube-manifests", "kube-weft.yml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, p, string(b))
}

// comparable returns o with the JSON documents in a ConfigMap's data
// decoded, so that the manifest's and the chart's spelling of one JSON
// document compare equal.
func comparable(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	c := o.DeepCopy().Object
	if o.GetKind() == "ConfigMap" {
		data, _ := c["data"].(map[string]any)
		for k, v := range data {
			if s, ok := v.(string); ok && strings.HasSuffix(k, ".json") {
				var doc any
				if err := json.Unmarshal([]byte(s), &doc); err != nil {
					t.Fatalf("ConfigMap %s %s: %v", o.GetName(), k, err)
				}
				data[k] = doc
			}
		}
	}
	return c
}

// TestDefaultsAreTheManifest checks that the chart with its default values
// renders exactly the objects of kube-manifests/kube-weft.yml, but the
// Namespace (a chart installs into the release's namespace): the two cannot
// drift apart.
func TestDefaultsAreTheManifest(t *testing.T) {
	h := newHelm(t)
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
	}
	want := map[string]map[string]any{}
	for _, o := range readManifest(t) {
		if o.GetKind() == "Namespace" {
			if o.GetName() != "kube-weft" {
				t.Fatalf("the manifest's namespace is %s; the test renders the chart into kube-weft", o.GetName())
			}
			continue
		}
		want[key(o)] = comparable(t, o)
	}
	got := map[string]map[string]any{}
	for _, o := range h.template(t, "") {
		if _, dup := got[key(o)]; dup {
			t.Errorf("the chart renders %s twice", key(o))
		}
		got[key(o)] = comparable(t, o)
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("the chart does not render %s", k)
			continue
		}
		if !reflect.DeepEqual(g, w) {
			gj, _ := json.MarshalIndent(g, "", " ")
			wj, _ := json.MarshalIndent(w, "", " ")
			t.Errorf("%s differs:\nchart:    %s\nmanifest: %s", k, gj, wj)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("the chart renders %s, which the manifest does not have", k)
		}
	}
}

// TestNetConf checks where Flannel's chart's values land in net-conf.json,
// and that weft's parser reads them there.
func TestNetConf(t *testing.T) {
	h := newHelm(t)
	cases := []struct {
		name, values string
		want         string // net-conf.json
		check        func(*subnet.Config) bool
	}{{
		name: "VXLAN, every setting",
		values: `
podCidr: 10.42.0.0/16
flannel: {backendPort: 4789, vni: 4096, mtu: 1400, GBP: true, directRouting: true, enableNFTables: true}
`,
		want: `{"Network":"10.42.0.0/16","EnableNFTables":true,
			"Backend":{"Type":"vxlan","Port":4789,"VNI":4096,"MTU":1400,"GBP":true,"DirectRouting":true}}`,
		check: func(c *subnet.Config) bool {
			b := c.Backend
			return c.Network.String() == "10.42.0.0/16" && !c.EnableIPv6 && c.EnableNFTables &&
				b.Type == "vxlan" && b.Port == 4789 && b.VNI == 4096 && b.MTU == 1400 && b.GBP && b.DirectRouting
		},
	}, {
		name:   "vxlan, its fallback without the fast path",
		values: "flannel: {fastPath: false}\n",
		want:   `{"Network":"10.244.0.0/16","EnableNFTables":false,"Backend":{"Type":"vxlan","FastPath":false}}`,
		check: func(c *subnet.Config) bool {
			return c.Backend.Type == "vxlan" && !c.Backend.FastPath
		},
	}, {
		name:   "uvxlan, the fast path asked for",
		values: "flannel: {backend: uvxlan, fastPath: true}\n",
		want:   `{"Network":"10.244.0.0/16","EnableNFTables":false,"Backend":{"Type":"uvxlan","FastPath":true}}`,
		check: func(c *subnet.Config) bool {
			return c.Backend.Type == "uvxlan" && c.Backend.FastPath
		},
	}, {
		name:   "uvxlan, port 0 is the default",
		values: "flannel: {backend: uvxlan, backendPort: 0, vni: 0}\n",
		want:   `{"Network":"10.244.0.0/16","EnableNFTables":false,"Backend":{"Type":"uvxlan","Port":0,"VNI":0}}`,
		check: func(c *subnet.Config) bool {
			return c.Backend.Type == "uvxlan" && c.Backend.Port == 8472 && c.Backend.VNI == 0
		},
	}, {
		name:   "WireGuard, dual-stack",
		values: wireguardDualStack,
		want: `{"Network":"10.42.0.0/16","IPv6Network":"fd00:42::/56","EnableIPv6":true,"EnableNFTables":false,
			"Backend":{"Type":"wireguard","ListenPort":51830,"ListenPortV6":51831,"MTU":1420,
			"PSK":"aGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8gd28=","Mode":"auto","PersistentKeepaliveInterval":25}}`,
		check: func(c *subnet.Config) bool {
			b := c.Backend
			return c.EnableIPv4 && c.EnableIPv6 && c.IPv6Network.String() == "fd00:42::/56" &&
				b.ListenPort == 51830 && b.ListenPortV6 == 51831 && b.MTU == 1420 && b.PSK != "" &&
				b.Mode == subnet.WireGuardAuto && b.PersistentKeepaliveInterval == 25
		},
	}, {
		name:   "host-gw, IPv6 only",
		values: "podCidr: \"\"\npodCidrv6: fd00:42::/56\nflannel: {backend: host-gw}\n",
		want:   `{"EnableIPv4":false,"IPv6Network":"fd00:42::/56","EnableIPv6":true,"EnableNFTables":false,"Backend":{"Type":"host-gw"}}`,
		check: func(c *subnet.Config) bool {
			return !c.EnableIPv4 && c.EnableIPv6 && c.Backend.Type == "host-gw"
		},
	}, {
		name:   "alloc",
		values: "flannel: {backend: alloc}\n",
		want:   `{"Network":"10.244.0.0/16","EnableNFTables":false,"Backend":{"Type":"alloc"}}`,
		check:  func(c *subnet.Config) bool { return c.Backend.Type == "alloc" },
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var cm corev1.ConfigMap
			find(t, h.template(t, tc.values), "ConfigMap", &cm)
			raw := cm.Data["net-conf.json"]
			var got, want any
			if err := json.Unmarshal([]byte(raw), &got); err != nil {
				t.Fatalf("net-conf.json: %v\n%s", err, raw)
			}
			if err := json.Unmarshal([]byte(tc.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("net-conf.json:\n%s\nwant %s", raw, tc.want)
			}
			cfg, err := subnet.ParseConfig([]byte(raw))
			if err != nil {
				t.Fatalf("weft refuses the rendered net-conf.json: %v\n%s", err, raw)
			}
			if !tc.check(cfg) {
				t.Errorf("weft reads the rendered net-conf.json as %+v", cfg)
			}
		})
	}
}

// TestDaemonSet checks where the chart's other values land.
func TestDaemonSet(t *testing.T) {
	h := newHelm(t)
	const image = "registry.example/weft:v9"
	cases := []struct {
		name, values string
		check        func(t *testing.T, spec corev1.PodSpec, cm corev1.ConfigMap)
	}{{
		name: "image, args, directories, scheduling, pull secrets, resources",
		values: `
global: {imagePullSecrets: [{name: regcred}]}
flannel:
  image: {repository: registry.example/weft, tag: v9}
  args: [--kube-subnet-mgr, --iface-regex=^eth]
  cniBinDir: /usr/libexec/cni
  cniConfDir: /etc/cni/conf.d
  tolerations: [{operator: Exists}]
  nodeSelector: {weft: "yes"}
  resources: {requests: {cpu: 50m}, limits: {memory: 200Mi}}
`,
		check: func(t *testing.T, spec corev1.PodSpec, _ corev1.ConfigMap) {
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				if c.Image != image {
					t.Errorf("container %s runs %s, want %s", c.Name, c.Image, image)
				}
			}
			if w := spec.Containers[0]; !reflect.DeepEqual(w.Args, []string{"--kube-subnet-mgr", "--iface-regex=^eth", "--health-addr=127.0.0.1:9470"}) {
				t.Errorf("weftd args %q", w.Args)
			}
			if w := spec.Containers[0]; w.Resources.Requests.Cpu().String() != "50m" || w.Resources.Limits.Memory().String() != "200Mi" {
				t.Errorf("weftd resources %+v", w.Resources)
			}
			paths := map[string]string{}
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					paths[v.Name] = v.HostPath.Path
				}
			}
			if paths["cni-plugin"] != "/usr/libexec/cni" || paths["cni"] != "/etc/cni/conf.d" {
				t.Errorf("host paths %v", paths)
			}
			if !reflect.DeepEqual(spec.Tolerations, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}) {
				t.Errorf("tolerations %+v", spec.Tolerations)
			}
			if !reflect.DeepEqual(spec.NodeSelector, map[string]string{"weft": "yes"}) {
				t.Errorf("nodeSelector %v", spec.NodeSelector)
			}
			if !reflect.DeepEqual(spec.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "regcred"}}) {
				t.Errorf("imagePullSecrets %v", spec.ImagePullSecrets)
			}
		},
	}, {
		name:   "health server on another port",
		values: "flannel: {healthz: {port: 9999, readinessProbe: {periodSeconds: 7}}}\n",
		check: func(t *testing.T, spec corev1.PodSpec, _ corev1.ConfigMap) {
			w := spec.Containers[0]
			if w.Args[len(w.Args)-1] != "--health-addr=127.0.0.1:9999" {
				t.Errorf("weftd args %q", w.Args)
			}
			for _, p := range []*corev1.Probe{w.LivenessProbe, w.ReadinessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntValue() != 9999 || p.HTTPGet.Host != "127.0.0.1" {
					t.Errorf("probe %+v", p)
				}
			}
			if w.ReadinessProbe.PeriodSeconds != 7 || w.LivenessProbe.PeriodSeconds != 10 {
				t.Errorf("probe periods %d, %d", w.LivenessProbe.PeriodSeconds, w.ReadinessProbe.PeriodSeconds)
			}
		},
	}, {
		name:   "no health server, no conflist",
		values: "flannel: {healthz: {port: 0}, skipCNIConfigInstallation: true}\n",
		check: func(t *testing.T, spec corev1.PodSpec, _ corev1.ConfigMap) {
			w := spec.Containers[0]
			if w.Args[len(w.Args)-1] != "--health-addr=" || w.LivenessProbe != nil || w.ReadinessProbe != nil {
				t.Errorf("weftd args %q, probes %v %v: want the health server off and no probes", w.Args, w.LivenessProbe, w.ReadinessProbe)
			}
			var names []string
			for _, c := range spec.InitContainers {
				names = append(names, c.Name)
			}
			if !reflect.DeepEqual(names, []string{"install-cni-plugin"}) {
				t.Errorf("init containers %q: want only install-cni-plugin", names)
			}
		},
	}, {
		name:   "BPF where uvxlan's fast path may run",
		values: "",
		check: func(t *testing.T, _ corev1.PodSpec, _ corev1.ConfigMap) {
			for _, c := range []struct {
				values string
				bpf    bool
			}{
				{"flannel: {backend: vxlan}", true}, // falls back to uvxlan
				{"flannel: {backend: uvxlan}", true},
				{"flannel: {backend: uvxlan, fastPath: true}", true},
				{"flannel: {backend: uvxlan, fastPath: false}", false},
				{"flannel: {backend: vxlan, fastPath: false}", false},
				{"flannel: {backend: host-gw}", false},
				{"flannel: {backend: wireguard}", false},
				{"flannel: {backend: alloc}", false},
			} {
				var ds appsv1.DaemonSet
				find(t, h.template(t, c.values), "DaemonSet", &ds)
				want := []corev1.Capability{"NET_ADMIN", "NET_RAW"}
				if c.bpf {
					want = append(want, "BPF")
				}
				if sc := ds.Spec.Template.Spec.Containers[0].SecurityContext; sc == nil || sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Add, want) {
					t.Errorf("%s: weftd's securityContext %+v, want capabilities %v", c.values, sc, want)
				}
			}
		},
	}, {
		name:   "own conflist",
		values: "flannel:\n  cniConf: '{\"cniVersion\":\"1.0.0\",\"name\":\"pods\",\"plugins\":[{\"type\":\"weft\",\"mtu\":1400}]}'\n",
		check: func(t *testing.T, _ corev1.PodSpec, cm corev1.ConfigMap) {
			if got := cm.Data["cni-conf.json"]; strings.TrimSpace(got) != `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"weft","mtu":1400}]}` {
				t.Errorf("cni-conf.json %s", got)
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := h.template(t, tc.values)
			var ds appsv1.DaemonSet
			var cm corev1.ConfigMap
			find(t, objs, "DaemonSet", &ds)
			find(t, objs, "ConfigMap", &cm)
			tc.check(t, ds.Spec.Template.Spec, cm)
		})
	}
}

// TestRefused checks that values with no meaning in weft, and bad values,
// fail the render with a message that names them.
func TestRefused(t *testing.T) {
	h := newHelm(t)
	cases := []struct{ name, values, want string }{
		{"udp backend", "flannel: {backend: udp}", "use uvxlan"},
		{"ipsec backend", "flannel: {backend: ipsec}", "use wireguard"},
		{"extension backend", "flannel: {backend: extension}", "commands that the chart cannot set"},
		{"unknown backend", "flannel: {backend: geneve}", "flannel.backend=geneve: unknown"},
		{"Flannel's CNI image", "flannel: {flannel_cni: {image: {repository: x, tag: y}}}", "flannel.flannel_cni: weft has no separate CNI plugin image"},
		{"Windows MAC prefix", "flannel: {macPrefix: 0E-2A}", "flannel.macPrefix"},
		{"network policies", "netpol: {enabled: true}", "netpol.enabled=true"},
		{"network policy image", "netpol: {image: {repository: x}}", "netpol.image"},
		{"VNI for host-gw", "flannel: {backend: host-gw, vni: 2}", "flannel.vni: has no meaning for backend host-gw"},
		{"GBP for uvxlan", "flannel: {backend: uvxlan, GBP: false}", "flannel.GBP: has no meaning for backend uvxlan"},
		{"fastPath for host-gw", "flannel: {backend: host-gw, fastPath: false}", "flannel.fastPath: has no meaning for backend host-gw"},
		{"fastPath not a bool", "flannel: {fastPath: \"no\"}", "fastPath"},
		{"PSK for vxlan", "flannel: {psk: aGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8gd28=}", "flannel.psk: has no meaning for backend vxlan"},
		{"IPv6 port for vxlan", "flannel: {backendPortv6: 1}", "flannel.backendPortv6: has no meaning for backend vxlan"},
		{"MTU for alloc", "flannel: {backend: alloc, mtu: 1500}", "flannel.mtu: has no meaning for backend alloc"},
		{"ipip backend", "flannel: {backend: ipip}", "flannel.backend=ipip: Flannel's ipip backend is not in weft yet"},
		{"no network", "podCidr: \"\"", "podCidr and podCidrv6 are both empty"},
		{"bad IPv4 CIDR", "podCidr: 10.244.0.0", `podCidr "10.244.0.0": not an IPv4 CIDR`},
		{"bad IPv6 CIDR", "podCidrv6: 10.0.0.0/8", `podCidrv6 "10.0.0.0/8": not an IPv6 CIDR`},
		{"health flag in args", "flannel: {args: [--kube-subnet-mgr, --healthz-port=8081]}", "set that instead"},
		{"MTU below IPv6's minimum", "flannel: {mtu: 1000}", "flannel.mtu 1000: must be 0"},
		{"conflist not JSON", "flannel: {cniConf: '{'}", "flannel.cniConf: not JSON"},
		{"Flannel's conflist", `flannel: {cniConf: '{"plugins":[{"type":"flannel","delegate":{}}]}'}`, "flannel.cniConf: a plugin of type flannel"},
		{"conflist without weft", `flannel: {cniConf: '{"plugins":[{"type":"bridge"}]}'}`, "no plugin of type weft"},
		{"unknown key", "flannel: {vxlanPort: 1}", "additional properties 'vxlanPort' not allowed"},
		{"unknown top-level key", "image: x", "additional properties 'image' not allowed"},
		{"VNI too large", "flannel: {vni: 16777216}", "/flannel/vni"},
		{"port not a number", "flannel: {backendPort: eighty}", "/flannel/backendPort"},
		{"bad tunnel mode", "flannel: {backend: wireguard, tunnelMode: both}", "/flannel/tunnelMode"},
		{"bad PSK", "flannel: {backend: wireguard, psk: secret}", "/flannel/psk"},
		{"bad health port", "flannel: {healthz: {port: 65536}}", "/flannel/healthz/port"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "weft", chartDir(t)}, valuesFile(t, tc.values+"\n")...)
			out, err := h.run(args...)
			if err == nil {
				t.Fatalf("helm template with %q succeeded:\n%s", tc.values, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template with %q: %v\nwant a message containing %q", tc.values, err, tc.want)
			}
		})
	}
}
