package daemon

import (
	"io"
	"strings"
	"testing"
)

// TestNetworkPolicyFlag: on by default in weft's Kubernetes mode, off when
// run as flanneld (a cluster moving from Flannel keeps its add-on), either
// way by the flag; set to true in etcd mode, where there are no policies,
// it is an error.
func TestNetworkPolicyFlag(t *testing.T) {
	kube := []string{"--kube-subnet-mgr", "--node-name", "n1"}
	for _, tc := range []struct {
		name, prog string
		args       []string
		want       bool
	}{
		{"weftd", "weftd", kube, true},
		{"weftd off", "weftd", append(kube, "--network-policy=false"), false},
		{"flanneld", "/opt/bin/flanneld", kube, false},
		{"flanneld on", "/opt/bin/flanneld", append(kube, "--network-policy"), true},
		{"flannel-compat", "weftd", append(kube, "--flannel-compat"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseFlags(tc.prog, tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.networkPolicy != tc.want {
				t.Errorf("networkPolicy %v, want %v", c.networkPolicy, tc.want)
			}
		})
	}
	if _, err := parseFlags("weftd", []string{"--network-policy"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--kube-subnet-mgr") {
		t.Errorf("--network-policy in etcd mode: %v", err)
	}
	if _, err := parseFlags("weftd", nil, io.Discard); err != nil {
		t.Errorf("etcd mode with the default: %v", err)
	}
}
