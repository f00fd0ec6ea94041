package subnet

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

// FuzzParseKey: a key that parses is written back by MakeKey to a key that
// parses to the same subnets, and every subnet is masked and of its family.
func FuzzParseKey(f *testing.F) {
	for _, k := range []string{"10.244.59.0-24", "10.244.92.0-24&fd00:10:244:50::-64", "0.0.0.0-0&fd00::-64", "0.0.0.0-1", "x", "1.2.3.4-33"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		v4, v6, err := ParseKey(key)
		if err != nil {
			return
		}
		if v4.IsValid() && (!v4.Addr().Is4() || v4 != v4.Masked()) || v6.IsValid() && (!v6.Addr().Is6() || v6.Addr().Is4In6() || v6 != v6.Masked()) {
			t.Fatalf("ParseKey(%q) = %v, %v: not masked subnets of their family", key, v4, v6)
		}
		b4, b6, err := ParseKey(MakeKey(v4, v6))
		if err != nil || b4 != v4 || b6 != v6 {
			t.Fatalf("round trip of %q via %q: %v %v %v", key, MakeKey(v4, v6), b4, b6, err)
		}
	})
}

// FuzzLeaseValue: a value that decodes has addresses of their family,
// encodes with Flannel's field names in Flannel's order, and decodes back
// to the same attrs, which encode to the same bytes.
func FuzzLeaseValue(f *testing.F) {
	f.Add(`{"PublicIP":"192.168.1.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`)
	f.Add(`{"PublicIP":"0.0.0.0","PublicIPv6":"fd77::1","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`)
	f.Add(`{"PublicIP":"10.0.0.1","BackendType":"host-gw","BackendData":{"x":1}}`)
	f.Add(`{"PublicIP":"0.0.0.0","PublicIPv6":"fd77::1","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"4e-fb-7d-bf-6b-2d"}}`)
	f.Add(`{"PublicIP":"","PublicIPv6":"fe80::1%eth0","BackendType":"host-gw","BackendData":null}`)
	f.Add(`{"PublicIP":"10.0.0.1","PublicIPv6":"::","BackendType":"vxlan","BackendData":{"VNI":0,"VtepMAC":"4efb.7dbf.6b2d"}}`)
	f.Add(`{"publicip":"10.0.0.1","PublicIPv6":null,"BackendType":"wireguard","BackendData":{"PublicKey":"x","Port":51820}}`)
	f.Fuzz(func(t *testing.T, value string) {
		var a LeaseAttrs
		if json.Unmarshal([]byte(value), &a) != nil {
			return
		}
		if a.PublicIP.IsValid() && !a.PublicIP.Is4() || a.PublicIPv6.IsValid() && (!a.PublicIPv6.Is6() || a.PublicIPv6.Is4In6()) {
			t.Fatalf("%q decoded to addresses of the wrong family: %+v", value, a)
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatalf("decoded %q to %+v, which does not encode: %v", value, a, err)
		}
		checkFlannelFields(t, b)
		var back LeaseAttrs
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(a, back) {
			t.Fatalf("round trip of %q: %+v → %s → %+v (%v)", value, a, b, back, err)
		}
		if again, err := json.Marshal(back); err != nil || string(again) != string(b) {
			t.Fatalf("%q encodes to %s, then to %s (%v)", value, b, again, err)
		}
	})
}

// checkFlannelFields fails t unless lease value b has flanneld's fields in
// flanneld's order: PublicIP and PublicIPv6 always, then BackendType,
// BackendData and BackendV6Data where present; backend data of a vxlan
// lease has exactly VNI and VtepMAC, of a wireguard lease PublicKey and Port.
func checkFlannelFields(t *testing.T, b []byte) {
	t.Helper()
	fields := objectFields(t, b)
	var names []string
	for _, f := range fields {
		names = append(names, f.name)
	}
	want := []string{"PublicIP", "PublicIPv6"}
	for _, n := range []string{"BackendType", "BackendData", "BackendV6Data"} {
		if slices.Contains(names, n) {
			want = append(want, n)
		}
	}
	if !slices.Equal(names, want) {
		t.Fatalf("%s: fields %q, want %q", b, names, want)
	}
	var typ string
	for _, f := range fields {
		switch f.name {
		case "BackendType":
			if err := json.Unmarshal(f.value, &typ); err != nil {
				t.Fatalf("%s: BackendType: %v", b, err)
			}
		case "BackendData", "BackendV6Data":
			var data []string
			for _, d := range objectFields(t, f.value) {
				data = append(data, d.name)
			}
			want := map[string][]string{BackendTypeVXLAN: {"VNI", "VtepMAC"}, BackendTypeWireGuard: {"PublicKey", "Port"}}[typ]
			if !slices.Equal(data, want) {
				t.Fatalf("%s: %s of a %q lease has fields %q, want %q", b, f.name, typ, data, want)
			}
		}
	}
}

type jsonField struct {
	name  string
	value json.RawMessage
}

// objectFields is the fields of JSON object b, in order.
func objectFields(t *testing.T, b []byte) []jsonField {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%s: not an object (%v)", b, err)
	}
	var fields []jsonField
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		f := jsonField{name: tok.(string)}
		if err := d.Decode(&f.value); err != nil {
			t.Fatalf("%s: field %s: %v", b, f.name, err)
		}
		fields = append(fields, f)
	}
	return fields
}

// FuzzParseConfig: a config that parses is consistent: networks masked,
// node subnets longer than the network, SubnetMin ≤ SubnetMax inside it,
// and the first node subnet fits.
func FuzzParseConfig(f *testing.F) {
	f.Add(`{"Network":"10.244.0.0/16"}`)
	f.Add(`{"Network":"10.1.0.0/28","SubnetLen":30}`)
	f.Add(`{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fd00:10:244::/56","Backend":{"Type":"uvxlan","VNI":7}}`)
	f.Add(`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/120","IPv6SubnetLen":126}`)
	f.Fuzz(func(t *testing.T, js string) {
		c, err := ParseConfig([]byte(js))
		if err != nil {
			return
		}
		check := func(on bool, network netip.Prefix, l int, lo, hi netip.Addr, v6 bool) {
			if !on {
				return
			}
			if network != network.Masked() || l <= network.Bits() || !network.Contains(lo) || !network.Contains(hi) || lo.Compare(hi) > 0 {
				t.Fatalf("%s parsed to an inconsistent config %+v", js, c)
			}
			if first := c.SubnetAt(v6, 0); !c.Fits(first) {
				t.Fatalf("%s: first node subnet %s does not fit", js, first)
			}
		}
		check(c.EnableIPv4, c.Network, c.SubnetLen, c.SubnetMin, c.SubnetMax, false)
		check(c.EnableIPv6, c.IPv6Network, c.IPv6SubnetLen, c.IPv6SubnetMin, c.IPv6SubnetMax, true)
	})
}

// FuzzParseFile: a subnet file that parses marshals to one that parses to
// the same values.
func FuzzParseFile(f *testing.F) {
	f.Add("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.59.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n")
	f.Add("FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:50::1/64\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=false\n")
	f.Fuzz(func(t *testing.T, data string) {
		file, err := ParseFile([]byte(data))
		if err != nil {
			return
		}
		back, err := ParseFile(file.Marshal())
		if err != nil || back != file {
			t.Fatalf("round trip of %q: %+v → %q → %+v (%v)", data, file, file.Marshal(), back, err)
		}
	})
}
