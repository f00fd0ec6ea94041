package plugin

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// FuzzParseConfig: a CNI config that parses has absolute paths (the state
// directory, as "flannel"), a valid bridge name and a store directory right under ipam.dataDir, and
// re-encoded parses to the same weft settings.
func FuzzParseConfig(f *testing.F) {
	f.Add(`{"cniVersion":"1.1.0","name":"weft","type":"weft"}`)
	f.Add(`{"cniVersion":"1.0.0","name":"n","type":"weft","subnetFile":"/run/flannel/subnet.env","dataDir":"/var/lib/cni/weft","bridge":"br0","mtu":1400,"hairpinMode":false}`)
	f.Add(`{"name":"x","ipam":{"type":"host-local","dataDir":"/srv/ipam"}}`)
	f.Add(`{"name":"cbr0","type":"flannel","dataDir":"/var/lib/cni/flannel","ipam":{"routes":[{"dst":"10.9.0.0/16"}]},"delegate":{"hairpinMode":true,"isDefaultGateway":false,"forceAddress":true}}`)
	f.Fuzz(func(t *testing.T, js string) {
		c, err := ParseConfig([]byte(js))
		if err != nil {
			return
		}
		if !filepath.IsAbs(c.SubnetFile) || (c.stateDir() != "" && !filepath.IsAbs(c.stateDir())) || !filepath.IsAbs(c.IPAM.DataDir) || validLinkName(c.Bridge) != nil ||
			filepath.Dir(c.storeDir()) != filepath.Clean(c.IPAM.DataDir) {
			t.Fatalf("%s parsed to an invalid config %+v", js, c)
		}
		// PluginConf's own MarshalJSON hides the weft keys: encode them.
		b, err := json.Marshal(map[string]any{"cniVersion": c.CNIVersion, "name": c.Name, "type": c.Type,
			"subnetFile": c.SubnetFile, "dataDir": c.DataDir, "bridge": c.Bridge, "mtu": c.MTU, "hairpinMode": c.HairpinMode,
			"ipam": map[string]string{"dataDir": c.IPAM.DataDir}})
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseConfig(b)
		if err != nil || back.SubnetFile != c.SubnetFile || back.DataDir != c.DataDir || back.Bridge != c.Bridge ||
			back.MTU != c.MTU || back.hairpin() != c.hairpin() || back.Name != c.Name || back.storeDir() != c.storeDir() || back.stateDir() != c.stateDir() {
			t.Fatalf("round trip of %s via %s: %+v (%v)", js, b, back, err)
		}
	})
}
