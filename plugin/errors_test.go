package plugin_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

// TestBadInput runs the binary with broken input; each case must print a
// CNI error with the spec's code, exit non-zero, and leave no veth, no
// allocation and nothing inside the pod namespace.
func TestBadInput(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	pod := nettest.NewNS(t, "pod")
	cases := badInputs(t, e, pod)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, rc := e.run(t, c.env, c.stdin)
			if rc == 0 {
				t.Fatalf("exit 0, stdout %s", out)
			}
			ce := cniError(t, out)
			if c.code != 0 && ce.Code != c.code {
				t.Errorf("code %d, want %d: %s", ce.Code, c.code, out)
			}
			if !strings.Contains(strings.ToLower(ce.Msg+" "+ce.Details), strings.ToLower(c.msg)) {
				t.Errorf("message %q lacks %q", ce.Msg+" "+ce.Details, c.msg)
			}
			noLeftovers(t, e, pod, "weft")
		})
	}
}

type badInput struct {
	name  string
	env   map[string]string
	stdin string
	code  uint
	msg   string // a piece of the message
}

// badInputs prepares the fixtures (a file that is not a netns, a garbage
// subnet file, a non-bridge device) and returns the cases.
func badInputs(t *testing.T, e *env, pod *nettest.NS) []badInput {
	notNS := filepath.Join(t.TempDir(), "not-a-netns")
	os.WriteFile(notNS, nil, 0o644)
	garbage := filepath.Join(t.TempDir(), "garbage.env")
	os.WriteFile(garbage, []byte("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=banana\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"), 0o644)
	if err := namespace.Bridge(e.node, "cni0"); err != nil { // a bridge without an address yet
		t.Fatal(err)
	}
	nettest.MustRun(t, e.node, "ip", "link", "add", "notbr0", "type", "veth", "peer", "name", "notbr0p")

	good := map[string]any{"cniVersion": "1.0.0", "name": "weft", "type": "weft", "subnetFile": e.subnetFile, "dataDir": e.dataDir, "ipam": map[string]any{"dataDir": e.dataDir}}
	conf := func(mod map[string]any) string {
		c := map[string]any{}
		for k, v := range good {
			c[k] = v
		}
		for k, v := range mod {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		b, _ := json.Marshal(c)
		return string(b)
	}
	addEnv := func(mod map[string]string) map[string]string {
		env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "bad1", "CNI_NETNS": pod.Path, "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"}
		for k, v := range mod {
			if v == "" {
				delete(env, k)
			} else {
				env[k] = v
			}
		}
		return env
	}
	return []badInput{
		{"malformed JSON", addEnv(nil), `{"cniVersion":"1.0.0","name":`, 6, "unmarshal"},
		{"mtu of the wrong type", addEnv(nil), conf(map[string]any{"mtu": "big"}), 7, "mtu"},
		{"hairpinMode of the wrong type", addEnv(nil), conf(map[string]any{"hairpinMode": "yes"}), 7, "hairpinMode"},
		{"unsupported cniVersion", addEnv(nil), conf(map[string]any{"cniVersion": "9.9.9"}), 1, "incompatible"},
		{"missing name", addEnv(nil), conf(map[string]any{"name": nil}), 7, "name"},
		{"ipam of another type", addEnv(nil), conf(map[string]any{"ipam": map[string]any{"type": "static", "dataDir": e.dataDir}}), 2, "static"},
		{"ipam ranges", addEnv(nil), conf(map[string]any{"ipam": map[string]any{"dataDir": e.dataDir, "ranges": []any{}}}), 2, "ranges"},
		{"relative ipam dataDir", addEnv(nil), conf(map[string]any{"ipam": map[string]any{"dataDir": "data"}}), 7, "absolute"},
		{"delegate ipam", addEnv(nil), conf(map[string]any{"type": "flannel", "delegate": map[string]any{"ipam": map[string]any{"dataDir": e.dataDir}}}), 2, "delegate ipam"},
		{"relative subnetFile", addEnv(nil), conf(map[string]any{"subnetFile": "subnet.env"}), 7, "absolute"},
		{"relative dataDir", addEnv(nil), conf(map[string]any{"dataDir": "data"}), 7, "absolute"},
		{"mtu too small", addEnv(nil), conf(map[string]any{"mtu": 10}), 7, "mtu 10"},
		{"bridge name too long", addEnv(nil), conf(map[string]any{"bridge": "a-very-long-bridge-name"}), 7, "bridge"},
		{"bridge is not a bridge", addEnv(nil), conf(map[string]any{"bridge": "notbr0"}), 7, "not a bridge"},
		{"subnet file missing", addEnv(nil), conf(map[string]any{"subnetFile": "/nonexistent/subnet.env"}), 11, "does not exist"},
		{"subnet file garbage", addEnv(nil), conf(map[string]any{"subnetFile": garbage}), 7, "FLANNEL_SUBNET"},
		{"unknown CNI_COMMAND", addEnv(map[string]string{"CNI_COMMAND": "FROB"}), conf(nil), 4, "FROB"},
		{"no CNI_NETNS", addEnv(map[string]string{"CNI_NETNS": ""}), conf(nil), 4, "CNI_NETNS"},
		{"no CNI_IFNAME", addEnv(map[string]string{"CNI_IFNAME": ""}), conf(nil), 4, "CNI_IFNAME"},
		{"no CNI_CONTAINERID", addEnv(map[string]string{"CNI_CONTAINERID": ""}), conf(nil), 4, "CNI_CONTAINERID"},
		{"bad CNI_CONTAINERID", addEnv(map[string]string{"CNI_CONTAINERID": "a/b"}), conf(nil), 4, "containerID"},
		{"CNI_NETNS does not exist", addEnv(map[string]string{"CNI_NETNS": "/run/netns/wefttest-nope"}), conf(nil), 4, "wefttest-nope"},
		{"CNI_IFNAME too long", addEnv(map[string]string{"CNI_IFNAME": "a-very-long-ifname"}), conf(nil), 4, "interface name"},
		{"no cniVersion", addEnv(nil), conf(map[string]any{"cniVersion": nil}), 1, "incompatible"},
		{"DEL with malformed JSON", addEnv(map[string]string{"CNI_COMMAND": "DEL"}), `{"name":`, 6, "unmarshal"},
		{"CHECK with a garbage prevResult", addEnv(map[string]string{"CNI_COMMAND": "CHECK"}), conf(map[string]any{"prevResult": map[string]any{"ips": "nope"}}), 6, "prevResult"},
		{"CNI_NETNS is the node's own", addEnv(map[string]string{"CNI_NETNS": e.node.Path, "CNI_IFNAME": "podif0"}), conf(nil), 8, "own"},
		{"CNI_NETNS is not a netns", addEnv(map[string]string{"CNI_NETNS": notNS}), conf(nil), 4, "not-a-netns"},
		{"CHECK without prevResult", addEnv(map[string]string{"CNI_COMMAND": "CHECK"}), conf(nil), 7, "prevResult"},
		{"GC before 1.1.0", addEnv(map[string]string{"CNI_COMMAND": "GC"}), conf(nil), 1, "does not allow GC"},
	}
}

// noLeftovers: no veth on the node, no allocation, only lo in the pod.
func noLeftovers(t *testing.T, e *env, pod *nettest.NS, network string) {
	t.Helper()
	if ports := e.bridgePorts(t); len(ports) != 0 {
		t.Errorf("veths left on the node: %v", ports)
	}
	if left := plugintest.StoreFiles(t, e.dataDir, network); len(left) != 0 {
		t.Errorf("allocations left: %v", left)
	}
	if out := nettest.MustRun(t, pod, "ip", "-o", "link"); strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("pod namespace holds more than lo:\n%s", out)
	}
}

// TestFailedAddRollsBack: ADD that fails after allocating (the pod already
// has an eth0) releases the address and removes the veth.
func TestFailedAddRollsBack(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	pod := nettest.NewNS(t, "pod")
	nettest.MustRun(t, pod, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	if _, err := n.Add(pod, "dup"); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("ADD into a pod that has eth0: %v", err)
	}
	if ports := e.bridgePorts(t); len(ports) != 0 {
		t.Errorf("veths left: %v", ports)
	}
	if left := plugintest.StoreFiles(t, e.dataDir, "weft"); len(left) != 0 {
		t.Errorf("allocations left: %v", left)
	}
}

// TestExhausted: a /30 node subnet has one pod address; the second ADD is
// "try again later" and leaves nothing behind.
func TestExhausted(t *testing.T) {
	f := v4File(true)
	f.Subnet = f.Subnet.Masked()
	f.Subnet = netipPrefix(t, "10.244.59.1/30")
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	first := n.AddPod(t, "first")
	pod := nettest.NewNS(t, "second")
	_, err := n.Add(pod, "second")
	if err == nil || !strings.Contains(err.Error(), "no free address") {
		t.Fatalf("second ADD in a full /30: %v", err)
	}
	out, rc := e.run(t, map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "third", "CNI_NETNS": pod.Path, "CNI_IFNAME": "eth0", "CNI_PATH": "/x"},
		fmt.Sprintf(`{"cniVersion":"1.1.0","name":"weft","type":"weft","subnetFile":%q,"dataDir":%q,"ipam":{"dataDir":%[2]q}}`, e.subnetFile, e.dataDir))
	if ce := cniError(t, out); rc == 0 || ce.Code != 11 {
		t.Errorf("exit %d, error %+v; want code 11", rc, ce)
	}
	if left := plugintest.StoreFiles(t, e.dataDir, "weft"); len(left) != 1 || left[0] != first.IP.String() {
		t.Errorf("store holds %v, want only %s", left, first.IP)
	}
	if out := nettest.MustRun(t, pod, "ip", "-o", "link"); strings.Contains(out, "eth0") {
		t.Errorf("pod got an eth0:\n%s", out)
	}
}

// TestDelTolerant: DEL of an unknown container and DEL after the pod's
// namespace is gone both succeed, and the second frees the address.
func TestDelTolerant(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"weft","type":"weft","subnetFile":%q,"dataDir":%q,"ipam":{"dataDir":%[2]q}}`, e.subnetFile, e.dataDir)
	out, rc := e.run(t, map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "never-added", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"}, conf)
	if rc != 0 {
		t.Fatalf("DEL of an unknown container: exit %d: %s", rc, out)
	}
	podNS, err := namespace.Create("gone")
	if err != nil {
		t.Fatal(err)
	}
	p, err := n.Add(podNS, "gone")
	if err != nil {
		podNS.Delete()
		t.Fatal(err)
	}
	if err := podNS.Delete(); err != nil {
		t.Fatal(err)
	}
	if err := n.Del(p); err != nil {
		t.Fatalf("DEL after the netns is gone: %v", err)
	}
	if left := plugintest.StoreFiles(t, e.dataDir, "weft"); len(left) != 0 {
		t.Errorf("allocations left: %v", left)
	}
	if ports := e.bridgePorts(t); len(ports) != 0 {
		t.Errorf("veths left: %v", ports)
	}
}
