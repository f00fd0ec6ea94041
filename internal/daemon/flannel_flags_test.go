package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// clearEnv unsets every WEFT_*, FLANNELD_* and pod variable for the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "WEFT_") || strings.HasPrefix(k, "FLANNELD_") ||
			k == "NODE_NAME" || k == "POD_NAME" || k == "POD_NAMESPACE" {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// TestFlanneldFlags parses each flanneld flag, as flanneld's documentation
// and `flanneld --help` spell it, and checks the setting it lands in.
func TestFlanneldFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		get  func(*config) any
		want any
	}{
		{"etcd-endpoints", []string{"--etcd-endpoints=http://10.0.0.2:2379"}, nil, func(c *config) any { return c.etcd.Endpoints }, "http://10.0.0.2:2379"},
		{"etcd-prefix", []string{"--etcd-prefix=/my/net"}, nil, func(c *config) any { return c.etcd.Prefix }, "/my/net"},
		{"etcd-keyfile", []string{"--etcd-keyfile=/k"}, nil, func(c *config) any { return c.etcd.KeyFile }, "/k"},
		{"etcd-certfile", []string{"--etcd-certfile=/c"}, nil, func(c *config) any { return c.etcd.CertFile }, "/c"},
		{"etcd-cafile", []string{"--etcd-cafile=/ca"}, nil, func(c *config) any { return c.etcd.CAFile }, "/ca"},
		{"etcd-username", []string{"--etcd-username=u"}, nil, func(c *config) any { return c.etcd.Username }, "u"},
		{"etcd-password", []string{"--etcd-password=p"}, nil, func(c *config) any { return c.etcd.Password }, "p"},
		{"iface once", []string{"--iface=eth1"}, nil, func(c *config) any { return c.ifaces }, []string{"eth1"}},
		{"iface repeated", []string{"--iface=eth1", "-iface", "10.0.0.7"}, nil, func(c *config) any { return c.ifaces }, []string{"eth1", "10.0.0.7"}},
		{"iface-regex repeated", []string{"--iface-regex=^en", "--iface-regex=^eth"}, nil, func(c *config) any { return c.ifaceRegexes }, []string{"^en", "^eth"}},
		{"iface-can-reach", []string{"--iface-can-reach=10.9.8.7"}, nil, func(c *config) any { return c.ifaceCanReach }, "10.9.8.7"},
		{"subnet-file", []string{"--subnet-file=/run/x.env"}, nil, func(c *config) any { return c.subnetFile }, "/run/x.env"},
		{"public-ip", []string{"--public-ip=192.0.2.1"}, nil, func(c *config) any { return c.publicIP }, "192.0.2.1"},
		{"public-ipv6", []string{"--public-ipv6=2001:db8::1"}, nil, func(c *config) any { return c.publicIPv6 }, "2001:db8::1"},
		{"subnet-lease-renew-margin minutes", []string{"--subnet-lease-renew-margin=60"}, nil, func(c *config) any { return c.renewMargin }, time.Hour},
		{"subnet-lease-renew-margin 1439", []string{"--subnet-lease-renew-margin=1439"}, nil, func(c *config) any { return c.renewMargin }, 1439 * time.Minute},
		{"subnet-lease-renew-margin duration", []string{"--subnet-lease-renew-margin=90m"}, nil, func(c *config) any { return c.renewMargin }, 90 * time.Minute},
		{"ip-masq", []string{"--ip-masq"}, nil, func(c *config) any { return c.ipMasq }, true},
		{"ip-masq=false", []string{"--ip-masq=false"}, nil, func(c *config) any { return c.ipMasq }, false},
		{"ip-masq-fully-random-disable", []string{"--ip-masq-fully-random-disable"}, nil, func(c *config) any { return c.flannel.masqRandomDisable }, true},
		{"kube-subnet-mgr", []string{"--kube-subnet-mgr"}, map[string]string{"NODE_NAME": "n1"}, func(c *config) any { return c.kubeSubnetMgr }, true},
		{"kube-api-url", []string{"--kube-api-url=https://10.0.0.1:6443"}, nil, func(c *config) any { return c.kubeAPIURL }, "https://10.0.0.1:6443"},
		{"kube-annotation-prefix", []string{"--kube-annotation-prefix=example.com"}, nil, func(c *config) any { return c.kubeAnnotPrefix }, "example.com"},
		{"kubeconfig-file", []string{"--kubeconfig-file=/etc/kubeconfig"}, nil, func(c *config) any { return c.kubeconfig }, "/etc/kubeconfig"},
		{"version", []string{"--version"}, nil, func(c *config) any { return c.version }, true},
		{"healthz-ip and port", []string{"--healthz-ip=127.0.0.1", "--healthz-port=8081"}, nil, func(c *config) any { return c.healthAddr }, "127.0.0.1:8081"},
		{"healthz-port alone", []string{"--healthz-port=8081"}, nil, func(c *config) any { return c.healthAddr }, "0.0.0.0:8081"},
		{"iptables-resync", []string{"--iptables-resync=7"}, nil, func(c *config) any { return c.flannel.resyncSeconds }, 7},
		{"iptables-forward-rules", []string{"--iptables-forward-rules=false"}, nil, func(c *config) any { return c.flannel.forwardRules }, false},
		{"ip-blackhole-route", []string{"--ip-blackhole-route"}, nil, func(c *config) any { return c.flannel.blackholeRoute }, true},
		{"net-config-path", []string{"--net-config-path=/etc/net.json"}, nil, func(c *config) any { return c.netConfPath }, "/etc/net.json"},
		{"set-node-network-unavailable", []string{"--set-node-network-unavailable=false"}, nil, func(c *config) any { return c.setNodeNetUnav }, false},
		{"v", []string{"--v=2"}, nil, func(c *config) any { return c.logLevel }, "debug"},
		{"v with log-level", []string{"--v=4", "--log-level=warn"}, nil, func(c *config) any { return c.logLevel }, "warn"},
		{"vmodule", []string{"--vmodule=main=3"}, nil, func(c *config) any { return c.flannel.vmodule }, "main=3"},
		{"log_backtrace_at", []string{"--log_backtrace_at=main.go:10"}, nil, func(c *config) any { return c.flannel.backtraceAt }, "main.go:10"},
		{"FLANNELD_ETCD_ENDPOINTS", nil, map[string]string{"FLANNELD_ETCD_ENDPOINTS": "http://10.0.0.2:2379"}, func(c *config) any { return c.etcd.Endpoints }, "http://10.0.0.2:2379"},
		{"FLANNELD_IFACE list", nil, map[string]string{"FLANNELD_IFACE": "eth1,eth2"}, func(c *config) any { return c.ifaces }, []string{"eth1", "eth2"}},
		{"FLANNELD_SUBNET_LEASE_RENEW_MARGIN", nil, map[string]string{"FLANNELD_SUBNET_LEASE_RENEW_MARGIN": "30"}, func(c *config) any { return c.renewMargin }, 30 * time.Minute},
		{"FLANNELD_IP_MASQ", nil, map[string]string{"FLANNELD_IP_MASQ": "true"}, func(c *config) any { return c.ipMasq }, true},
		{"FLANNELD_IP_MASQ_FULLY_RANDOM_DISABLE", nil, map[string]string{"FLANNELD_IP_MASQ_FULLY_RANDOM_DISABLE": "true"}, func(c *config) any { return c.flannel.masqRandomDisable }, true},
		{"FLANNELD_HEALTHZ_PORT", nil, map[string]string{"FLANNELD_HEALTHZ_PORT": "8081"}, func(c *config) any { return c.healthAddr }, "0.0.0.0:8081"},
		{"command line beats FLANNELD_", []string{"--etcd-prefix=/cli"}, map[string]string{"FLANNELD_ETCD_PREFIX": "/env"}, func(c *config) any { return c.etcd.Prefix }, "/cli"},
		{"WEFT_ beats FLANNELD_", nil, map[string]string{"FLANNELD_ETCD_PREFIX": "/flannel", "WEFT_ETCD_PREFIX": "/weft"}, func(c *config) any { return c.etcd.Prefix }, "/weft"},
		{"empty FLANNELD_ is unset", nil, map[string]string{"FLANNELD_SUBNET_FILE": ""}, func(c *config) any { return c.subnetFile }, "/run/flannel/subnet.env"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c, err := parseFlags("/opt/bin/flanneld", tc.args, io.Discard)
			if err != nil {
				t.Fatalf("parse %q: %v", tc.args, err)
			}
			if got := tc.get(c); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parse %q: got %#v, want %#v", tc.args, got, tc.want)
			}
		})
	}
}

// TestCompatDefaults checks the defaults that differ between weftd and
// flanneld, and how weftd decides to run as flanneld.
func TestCompatDefaults(t *testing.T) {
	tests := []struct {
		name       string
		prog       string
		args       []string
		env        map[string]string
		compat     bool
		masq       bool
		endpoints  string
		healthAddr string
	}{
		{"weftd", "/usr/local/bin/weftd", nil, nil, false, true, "http://127.0.0.1:2379", "127.0.0.1:9470"},
		{"flanneld by name", "/opt/bin/flanneld", nil, nil, true, false, "http://127.0.0.1:4001,http://127.0.0.1:2379", ""},
		{"relative flanneld", "flanneld", nil, nil, true, false, "http://127.0.0.1:4001,http://127.0.0.1:2379", ""},
		{"switch", "weftd", []string{"--flannel-compat"}, nil, true, false, "http://127.0.0.1:4001,http://127.0.0.1:2379", ""},
		{"switch=true single dash", "weftd", []string{"-flannel-compat=true"}, nil, true, false, "http://127.0.0.1:4001,http://127.0.0.1:2379", ""},
		{"switch=false", "weftd", []string{"--flannel-compat=false"}, nil, false, true, "http://127.0.0.1:2379", "127.0.0.1:9470"},
		{"switch in environment", "weftd", nil, map[string]string{"WEFT_FLANNEL_COMPAT": "true"}, true, false, "http://127.0.0.1:4001,http://127.0.0.1:2379", ""},
		{"weftd with flannel's healthz", "weftd", []string{"--healthz-port=8081"}, nil, false, true, "http://127.0.0.1:2379", "0.0.0.0:8081"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c, err := parseFlags(tc.prog, tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			got := []any{c.compat, c.ipMasq, c.etcd.Endpoints, c.healthAddr}
			want := []any{tc.compat, tc.masq, tc.endpoints, tc.healthAddr}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("compat, ip-masq, etcd-endpoints, health address: got %v, want %v", got, want)
			}
			if c.renewMargin != time.Hour || c.subnetFile != "/run/flannel/subnet.env" || c.netConfPath != "/etc/kube-flannel/net-conf.json" ||
				c.etcd.Prefix != "/coreos.com/network" || c.kubeAnnotPrefix != "flannel.alpha.coreos.com" || !c.setNodeNetUnav {
				t.Errorf("shared defaults changed: %+v", c)
			}
		})
	}
}

// TestFlannelCommandLines parses the command lines of Flannel's manifest
// and documentation, as a DaemonSet or a unit file passes them.
func TestFlannelCommandLines(t *testing.T) {
	clearEnv(t)
	// Documentation/kube-flannel.yml: the container's command and args, and
	// its POD_NAME/POD_NAMESPACE environment (no NODE_NAME).
	t.Setenv("POD_NAME", "kube-flannel-ds-x7k2p")
	t.Setenv("POD_NAMESPACE", "kube-flannel")
	c, err := parseFlags("/opt/bin/flanneld", []string{"--ip-masq", "--kube-subnet-mgr", "--healthz-port=8081"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.compat || !c.ipMasq || !c.kubeSubnetMgr || c.healthAddr != "0.0.0.0:8081" || c.nodeName != "" {
		t.Errorf("manifest command line: compat %v masq %v kube %v health %q node %q", c.compat, c.ipMasq, c.kubeSubnetMgr, c.healthAddr, c.nodeName)
	}
	clearEnv(t)
	// A systemd unit for the etcd mode, with options in FLANNELD_* as
	// Documentation/configuration.md describes.
	t.Setenv("FLANNELD_ETCD_ENDPOINTS", "https://10.0.0.2:2379,https://10.0.0.3:2379")
	t.Setenv("FLANNELD_ETCD_CAFILE", "/etc/ssl/etcd/ca.pem")
	t.Setenv("FLANNELD_IFACE", "eth1")
	c, err = parseFlags("/usr/bin/flanneld", []string{"--subnet-lease-renew-margin=60", "--ip-masq", "--iface-can-reach=10.0.0.2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.etcd.ClientConfig()
	if !reflect.DeepEqual(cc.Endpoints, []string{"https://10.0.0.2:2379", "https://10.0.0.3:2379"}) || cc.CAFile != "/etc/ssl/etcd/ca.pem" ||
		!reflect.DeepEqual(c.ifaces, []string{"eth1"}) || c.ifaceCanReach != "10.0.0.2" || c.renewMargin != time.Hour || !c.ipMasq {
		t.Errorf("unit command line: %+v", c)
	}
	if !reflect.DeepEqual(c.envApplied, []string{"FLANNELD_ETCD_CAFILE", "FLANNELD_ETCD_ENDPOINTS", "FLANNELD_IFACE"}) {
		t.Errorf("applied variables %v", c.envApplied)
	}
}

func TestFlanneldFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		prog string
		args []string
		env  map[string]string
		want string
	}{
		{"margin a day", "flanneld", []string{"--subnet-lease-renew-margin=1440"}, nil, "1 to 1439 minutes"},
		{"margin zero", "weftd", []string{"--subnet-lease-renew-margin=0"}, nil, "must be positive"},
		{"margin garbage", "weftd", []string{"--subnet-lease-renew-margin=soon"}, nil, "not a number of minutes"},
		{"can-reach not an IP", "flanneld", []string{"--iface-can-reach=eth0"}, nil, "not an IP address"},
		{"healthz-port range", "flanneld", []string{"--healthz-port=70000"}, nil, "between 0 and 65535"},
		{"iptables-resync at least 1", "flanneld", []string{"--iptables-resync=0"}, nil, "must be at least 1"},
		{"kube without node", "flanneld", []string{"--kube-subnet-mgr"}, nil, "needs the node name"},
		{"bad FLANNELD_ value", "flanneld", nil, map[string]string{"FLANNELD_HEALTHZ_PORT": "http"}, "FLANNELD_HEALTHZ_PORT"},
		{"unknown flag", "flanneld", []string{"--no-such-flag"}, nil, "no-such-flag"},
		{"dataplane nice range", "weftd", []string{"--dataplane-nice=-21"}, nil, "must be -20..19"},
		{"udp backend", "flanneld", []string{"--backend=udp"}, nil, `--backend: backend "udp": Flannel's udp backend is not supported; use "uvxlan"`},
		{"ipsec backend", "weftd", []string{"--backend=ipsec"}, nil, `--backend: backend "ipsec": Flannel's ipsec backend is not supported; use "wireguard"`},
		{"unknown backend", "weftd", []string{"--backend=gre"}, nil, `--backend: backend "gre": unknown, weft runs "vxlan"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := parseFlags(tc.prog, tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parse %q: error %v, want one saying %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestIgnoredFlagsAreReported checks that every flanneld setting weft does
// not act on is listed for the log, and that defaults list nothing.
func TestIgnoredFlagsAreReported(t *testing.T) {
	clearEnv(t)
	c, err := parseFlags("flanneld", []string{"--ip-masq"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if ig := c.ignored(); len(ig) != 0 {
		t.Errorf("defaults reported as ignored: %v", ig)
	}
	c, err = parseFlags("flanneld", []string{"--vmodule=x=2", "--log_backtrace_at=a.go:1", "--ip-masq-fully-random-disable",
		"--kube-api-url=https://k:6443"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range c.ignored() {
		got = append(got, f.flag)
	}
	want := []string{"--vmodule", "--log_backtrace_at", "--ip-masq-fully-random-disable", "--kube-api-url"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ignored %v, want %v", got, want)
	}
	// --iptables-forward-rules acts with and without --ip-masq,
	// --ip-masq-fully-random-disable with it.
	for _, args := range [][]string{{"--iptables-forward-rules=false"}, {"--iptables-forward-rules=false", "--ip-masq"},
		{"--ip-masq", "--ip-masq-fully-random-disable"}} {
		c, err := parseFlags("flanneld", args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if ig := c.ignored(); len(ig) != 0 {
			t.Errorf("%v reported as ignored: %v", args, ig)
		}
	}
}

// TestEtcdPasswordNeverShown: an etcd password from WEFT_ETCD_PASSWORD or
// FLANNELD_ETCD_PASSWORD reaches the etcd client config, but neither
// --help, nor a command line error, nor the start-up log lines about the
// flags (logFlannelFlags) show it.
func TestEtcdPasswordNeverShown(t *testing.T) {
	for _, variable := range []string{"WEFT_ETCD_PASSWORD", "FLANNELD_ETCD_PASSWORD"} {
		for _, prog := range []string{"weftd", "flanneld"} {
			t.Run(variable+" "+prog, func(t *testing.T) {
				clearEnv(t)
				t.Setenv(variable, "s3cret")
				var out strings.Builder
				if _, err := parseFlags(prog, []string{"--help"}, &out); !errors.Is(err, flag.ErrHelp) {
					t.Fatalf("--help: %v", err)
				}
				for _, args := range [][]string{{"--no-such-flag"}, {"--healthz-port=http"}, {"--backend=udp"}, {"--etcd-username=u", "extra"}} {
					_, err := parseFlags(prog, args, &out)
					if err == nil {
						t.Fatalf("%q parsed", args)
					}
					fmt.Fprintln(&out, err)
				}
				c, err := parseFlags(prog, []string{"--etcd-username=u"}, &out)
				if err != nil {
					t.Fatal(err)
				}
				if got := c.etcd.ClientConfig().Password; got != "s3cret" {
					t.Fatalf("password %q, want the variable's", got)
				}
				var logs strings.Builder
				logFlannelFlags(c, slog.New(slog.NewTextHandler(&logs, nil)))
				if strings.HasPrefix(variable, "FLANNELD_") && !strings.Contains(logs.String(), variable) {
					t.Errorf("the log does not name %s:\n%s", variable, logs.String())
				}
				if strings.Contains(out.String(), "s3cret") || strings.Contains(logs.String(), "s3cret") {
					t.Errorf("the password is shown:\n%s\n%s", out.String(), logs.String())
				}
			})
		}
	}
}
