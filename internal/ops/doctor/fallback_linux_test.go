package doctor

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

// TestFallbackReported: a weftd whose /metrics says it runs uvxlan in place
// of vxlan makes kernel/vxlan warn, with the way to install the module; a
// weftd without that series leaves the check as it was.
func TestFallbackReported(t *testing.T) {
	for _, tc := range []struct {
		name    string
		metrics string
		status  Status
		want    string
	}{
		{"fallback", "weft_ready 1\nweft_backend_fallback{configured=\"vxlan\",reason=\"no_vxlan_driver\",running=\"uvxlan\"} 1\n", Warn,
			"weftd runs uvxlan in place of vxlan: the kernel refused a VXLAN device for want of the driver"},
		{"no fallback", "weft_ready 1\n", OK, "is a TAP: uvxlan encapsulates in weftd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/metrics" {
					fmt.Fprint(w, tc.metrics)
				}
			}))
			defer srv.Close()
			cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`))
			if err != nil {
				t.Fatal(err)
			}
			s := &state{Node: Node{HealthAddr: strings.TrimPrefix(srv.URL, "http://"), Config: cfg}, r: &Report{},
				k: &inspect.Kernel{Device: inspect.Device{Name: "weft-u.1", Kind: inspect.KindTAP}}}
			checkWeftd(t.Context(), s)
			checkVXLANModule(s)
			c := s.r.Find("kernel/vxlan")
			if len(c) != 1 || c[0].Status != tc.status || !strings.Contains(c[0].Evidence, tc.want) {
				t.Fatalf("kernel/vxlan: %+v, want %v %q", c, tc.status, tc.want)
			}
			if tc.status == Warn && !strings.Contains(c[0].Fix, "linux-modules-extra") {
				t.Errorf("fix %q does not say how to install the module", c[0].Fix)
			}
		})
	}
}
