package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// env is one test node: a namespace with an uplink eth0 (192.168.77.1/24)
// to an "external" host namespace (192.168.77.2), and a subnet file.
type env struct {
	node, ext  *nettest.NS
	bin        string
	subnetFile string
	dataDir    string
}

var (
	nodeAddr = netip.MustParseAddr("192.168.77.1")
	extAddr  = netip.MustParseAddr("192.168.77.2")
)

func v4File(masq bool) subnet.File {
	return subnet.File{
		Network: netip.MustParsePrefix("10.244.0.0/16"),
		Subnet:  netip.MustParsePrefix("10.244.59.1/24"),
		MTU:     1450, IPMasq: masq,
	}
}

// newEnv builds the node; f, if valid, is written as its subnet file.
func newEnv(t *testing.T, f *subnet.File) *env {
	t.Helper()
	nettest.RequireRoot(t)
	rootBefore := rootLinks(t)
	t.Cleanup(func() {
		if after := rootLinks(t); !slices.Equal(rootBefore, after) {
			t.Errorf("root namespace links changed: before %v, after %v", rootBefore, after)
		}
	})
	e := &env{node: nettest.NewNS(t, "node"), ext: nettest.NewNS(t, "ext"), bin: nettest.Binary(t, "weft")}
	nettest.Veth(t, e.node, "eth0", e.ext, "eth0")
	for _, x := range []struct {
		n *nettest.NS
		a netip.Addr
	}{{e.node, nodeAddr}, {e.ext, extAddr}} {
		if err := namespace.AddAddr(x.n, "eth0", netip.PrefixFrom(x.a, 24)); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	e.subnetFile, e.dataDir = filepath.Join(dir, "subnet.env"), filepath.Join(dir, "data")
	if f != nil {
		if err := subnet.WriteFile(e.subnetFile, *f); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func (e *env) newNode(t *testing.T, o plugintest.Options) *plugintest.Node {
	if o.DataDir == "" {
		o.DataDir = e.dataDir
	}
	return plugintest.NewNode(t, e.node, e.bin, e.subnetFile, o)
}

func rootLinks(t *testing.T) []string {
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatalf("ip link in root namespace: %v", err)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.SplitN(l, ": ", 3); len(f) > 1 {
			names = append(names, strings.SplitN(f[1], "@", 2)[0])
		}
	}
	return names
}

// bridgePorts lists the links attached to cni0 in the node.
func (e *env) bridgePorts(t *testing.T) []string {
	t.Helper()
	out := nettest.MustRun(t, e.node, "ip", "-o", "link", "show", "master", "cni0")
	var ports []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		// "7: vethX@if2: <...>"; other lines are ip's warnings on stderr.
		f := strings.SplitN(l, ": ", 3)
		if _, err := strconv.Atoi(f[0]); err == nil && len(f) > 1 {
			ports = append(ports, strings.SplitN(f[1], "@", 2)[0])
		}
	}
	return ports
}

func ping(t *testing.T, from *nettest.NS, to netip.Addr) {
	t.Helper()
	if out, err := from.Run("ping", "-c", "1", "-W", "3", to.String()); err != nil {
		t.Errorf("ping %s from %s: %v\n%s", to, from.Name, err, out)
	}
}

// run executes the plugin binary directly inside the node namespace, as a
// runtime would, and returns its stdout and exit code.
func (e *env) run(t *testing.T, envv map[string]string, stdin string) ([]byte, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := e.node.Command(ctx, e.bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range envv {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout = &out
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.Bytes(), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.Bytes(), 0
}

// cniError decodes a CNI error printed on stdout.
func cniError(t *testing.T, out []byte) types.Error {
	t.Helper()
	var e types.Error
	if err := json.Unmarshal(out, &e); err != nil {
		t.Fatalf("stdout is not a CNI error: %v: %q", err, out)
	}
	return e
}

// tcpServe listens on port inside n and answers every connection with msg.
func tcpServe(t *testing.T, n *nettest.NS, port, msg string) {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func() (err error) { ln, err = net.Listen("tcp4", ":"+port); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(msg))
			c.Close()
		}
	}()
}

// tcpRead connects from inside n to addr and returns what it reads.
func tcpRead(n *nettest.NS, addr string) (string, error) {
	var c net.Conn
	err := n.Do(func() (err error) { c, err = net.DialTimeout("tcp4", addr, 5*time.Second); return err })
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	_, err = b.ReadFrom(c)
	return b.String(), err
}

func netipPrefix(t *testing.T, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
