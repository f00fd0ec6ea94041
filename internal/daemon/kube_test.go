//go:build !weft_nokube

package daemon

import (
	"io"
	"testing"
)

// TestKubeOptionsFromFlags: run as flanneld (by name or --flannel-compat)
// the Kubernetes registry writes flanneld's NetworkUnavailable reason, run
// as weftd its own; the annotation prefix is passed as given.
func TestKubeOptionsFromFlags(t *testing.T) {
	for _, tt := range []struct {
		prog    string
		args    []string
		flannel bool
	}{
		{"weftd", nil, false},
		{"/opt/bin/flanneld", nil, true},
		{"weftd", []string{"--flannel-compat"}, true},
	} {
		args := append([]string{"--kube-subnet-mgr", "--node-name", "n1", "--kube-annotation-prefix", "example.com/flannel"}, tt.args...)
		c, err := parseFlags(tt.prog, args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		o := kubeOptions(c, "n1", nil)
		if o.FlannelCondition != tt.flannel || o.AnnotationPrefix != "example.com/flannel" || o.NodeName != "n1" {
			t.Errorf("%s %v: options %+v, want FlannelCondition %v", tt.prog, tt.args, o, tt.flannel)
		}
	}
}
