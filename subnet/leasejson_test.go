package subnet

import (
	"encoding/json"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
)

var (
	testMAC  = MAC{0x4e, 0xfb, 0x7d, 0xbf, 0x6b, 0x2d}
	testMAC6 = MAC{0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x02}
)

// TestDecodeCanonical: values as flanneld and weft write them take the
// direct decoder and give these attrs (written out, not computed).
func TestDecodeCanonical(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        LeaseAttrs
	}{
		{"flanneld vxlan", `{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`,
			LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), BackendType: "vxlan", BackendData: &VXLANData{VNI: 1, VtepMAC: testMAC}}},
		{"dual-stack", `{"PublicIP":"192.168.77.1","PublicIPv6":"fd77::1","BackendType":"vxlan","BackendData":{"VNI":4096,"VtepMAC":"4e:fb:7d:bf:6b:2d"},"BackendV6Data":{"VNI":4096,"VtepMAC":"0a:58:0a:f4:01:02"}}`,
			LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), PublicIPv6: netip.MustParseAddr("fd77::1"), BackendType: "vxlan",
				BackendData: &VXLANData{VNI: 4096, VtepMAC: testMAC}, BackendV6Data: &VXLANData{VNI: 4096, VtepMAC: testMAC6}}},
		{"flanneld IPv6-only", `{"PublicIP":"0.0.0.0","PublicIPv6":"fd77::2","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"0a:58:0a:f4:01:02"}}`,
			LeaseAttrs{PublicIPv6: netip.MustParseAddr("fd77::2"), BackendType: "vxlan", BackendV6Data: &VXLANData{VNI: 1, VtepMAC: testMAC6}}},
		{"host-gw", `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"host-gw"}`,
			LeaseAttrs{PublicIP: netip.MustParseAddr("10.0.0.1"), BackendType: "host-gw"}},
		{"null data", `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":null}`,
			LeaseAttrs{PublicIP: netip.MustParseAddr("10.0.0.1"), BackendType: "vxlan"}},
		{"no backend", `{"PublicIP":"10.0.0.1","PublicIPv6":null}`, LeaseAttrs{PublicIP: netip.MustParseAddr("10.0.0.1")}},
		{"VNI 0", `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":0,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`,
			LeaseAttrs{PublicIP: netip.MustParseAddr("10.0.0.1"), BackendType: "vxlan", BackendData: &VXLANData{VtepMAC: testMAC}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := decodeCanonical([]byte(tc.value))
			if !ok {
				t.Fatalf("decodeCanonical(%s) did not take the value", tc.value)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decodeCanonical(%s) = %+v, want %+v", tc.value, got, tc.want)
			}
			var viaJSON LeaseAttrs
			if err := json.Unmarshal([]byte(tc.value), &viaJSON); err != nil || !reflect.DeepEqual(viaJSON, tc.want) {
				t.Fatalf("json.Unmarshal(%s) = %+v, %v; want %+v", tc.value, viaJSON, err, tc.want)
			}
		})
	}
}

// TestDecodeCanonicalDeclines: values written differently, or that the
// general path rejects or reads with its own rules, are left to it.
func TestDecodeCanonicalDeclines(t *testing.T) {
	const v = `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`
	for name, value := range map[string]string{
		"white space":       `{"PublicIP": "10.0.0.1","PublicIPv6":null}`,
		"field order":       `{"PublicIPv6":null,"PublicIP":"10.0.0.1"}`,
		"lower-case name":   `{"publicip":"10.0.0.1","PublicIPv6":null}`,
		"escape":            `{"PublicIP":"10.0.0.\u0031","PublicIPv6":null}`,
		"non-ASCII":         "{\"PublicIP\":\"10.0.0.1\",\"PublicIPv6\":null,\"BackendType\":\"vx\xfflan\"}",
		"IPv6 as PublicIP":  `{"PublicIP":"fd00::1","PublicIPv6":null}`,
		"mapped PublicIPv6": `{"PublicIP":"10.0.0.1","PublicIPv6":"::ffff:10.0.0.1"}`,
		"bad address":       `{"PublicIP":"10.0.0.256","PublicIPv6":null}`,
		"VNI 1.0":           `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1.0,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`,
		"VNI 01":            `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":01,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`,
		"VNI negative":      `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":-1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`,
		"VNI 10 digits":     `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1234567890,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`,
		"bad MAC":           `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d"}}`,
		"extra data field":  `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d","GBP":true}}`,
		"wireguard data":    `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"wireguard","BackendData":{"PublicKey":"x"}}`,
		"data without type": `{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":null}`,
		"trailing bytes":    v + ` `,
		"trailing value":    v + `{}`,
		"duplicate field":   v[:len(v)-1] + `,"BackendType":"host-gw"}`,
		"cut short":         v[:len(v)-1],
		"null":              `null`,
		"empty":             ``,
	} {
		if got, ok := decodeCanonical([]byte(value)); ok {
			t.Errorf("%s: decodeCanonical(%s) took it: %+v", name, value, got)
		}
	}
}

// TestDecodeCanonicalRoundTrip: whatever weft writes for a vxlan, host-gw
// or alloc lease, the direct decoder reads back as it was.
func TestDecodeCanonicalRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		var a LeaseAttrs
		a.BackendType = []string{BackendTypeVXLAN, BackendTypeHostGW, "alloc"}[i%3]
		if r.IntN(4) > 0 {
			a.PublicIP = netip.AddrFrom4([4]byte{byte(1 + r.IntN(254)), byte(r.IntN(256)), byte(r.IntN(256)), byte(1 + r.IntN(254))})
		}
		if r.IntN(2) == 0 {
			var b [16]byte
			b[0] = 0xfd
			for j := 1; j < 16; j++ {
				b[j] = byte(r.IntN(256))
			}
			a.PublicIPv6 = netip.AddrFrom16(b)
		}
		mac := func() *VXLANData {
			var m MAC
			for j := range m {
				m[j] = byte(r.IntN(256))
			}
			return &VXLANData{VNI: r.IntN(1 << 24), VtepMAC: m}
		}
		if a.BackendType == BackendTypeVXLAN && a.PublicIP.IsValid() {
			a.BackendData = mac()
		}
		if a.BackendType == BackendTypeVXLAN && a.PublicIPv6.IsValid() {
			a.BackendV6Data = mac()
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decodeCanonical(b)
		if !ok || !reflect.DeepEqual(got, a) {
			t.Fatalf("decodeCanonical(%s) = %+v, %v; want %+v", b, got, ok, a)
		}
	}
}

// FuzzLeaseFast: where the direct decoder takes a value, the general path
// accepts it too and gives the same attrs.
func FuzzLeaseFast(f *testing.F) {
	f.Add(`{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`)
	f.Add(`{"PublicIP":"0.0.0.0","PublicIPv6":"fd77::1","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"4e-fb-7d-bf-6b-2d"}}`)
	f.Add(`{"PublicIP":"","PublicIPv6":"fe80::1%eth0","BackendType":"host-gw","BackendData":null}`)
	f.Add(`{"PublicIP":"10.0.0.1","PublicIPv6":"::","BackendType":"vxlan","BackendData":{"VNI":0,"VtepMAC":"4efb.7dbf.6b2d"}}`)
	f.Fuzz(func(t *testing.T, value string) {
		fast, ok := decodeCanonical([]byte(value))
		if !ok {
			return
		}
		var general LeaseAttrs
		if err := general.unmarshalGeneral([]byte(value)); err != nil {
			t.Fatalf("decodeCanonical took %q (%+v), the general path rejects it: %v", value, fast, err)
		}
		if !reflect.DeepEqual(fast, general) {
			t.Fatalf("%q: decodeCanonical %+v, general path %+v", value, fast, general)
		}
	})
}

func BenchmarkLeaseDecode(b *testing.B) {
	v := []byte(`{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			var a LeaseAttrs
			if err := a.UnmarshalJSON(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			var a LeaseAttrs
			if err := a.unmarshalGeneral(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
