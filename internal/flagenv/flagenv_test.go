package flagenv

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestEnvironmentDefaults(t *testing.T) {
	t.Setenv("WEFT_ETCD_ENDPOINTS", "unix:///run/etcd.sock,https://10.0.0.1:2379")
	t.Setenv("WEFT_IP_MASQ", "false")
	t.Setenv("WEFT_RENEW", "90s")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	s := &Set{FS: fs}
	var e Etcd
	e.Register(s)
	var masq bool
	var renew time.Duration
	s.Bool(&masq, "ip-masq", true, "")
	s.Duration(&renew, "renew", time.Hour, "")
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--etcd-prefix", "/x"}); err != nil {
		t.Fatal(err)
	}
	cc := e.ClientConfig()
	if len(cc.Endpoints) != 2 || cc.Endpoints[0] != "unix:///run/etcd.sock" || e.Prefix != "/x" || masq || renew != 90*time.Second {
		t.Fatalf("endpoints %v prefix %q masq %v renew %v", cc.Endpoints, e.Prefix, masq, renew)
	}
}

func TestBadEnvironmentValues(t *testing.T) {
	t.Setenv("WEFT_IP_MASQ", "maybe")
	t.Setenv("WEFT_RENEW", "soon")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := &Set{FS: fs}
	var masq bool
	var renew time.Duration
	s.Bool(&masq, "ip-masq", true, "")
	s.Duration(&renew, "renew", time.Hour, "")
	err := s.Err()
	if err == nil {
		t.Fatal("bad environment values accepted")
	}
	for _, want := range []string{`WEFT_IP_MASQ="maybe": not a boolean`, `WEFT_RENEW="soon": not a duration`} {
		if !contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestStringsMinutesAndPrefixed(t *testing.T) {
	t.Setenv("WEFT_IFACE", "eth9, eth8")
	t.Setenv("FLANNELD_IFACE_REGEX", "^en,^eth")
	t.Setenv("FLANNELD_MARGIN", "45")
	t.Setenv("FLANNELD_NAME", "from-flanneld")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	s := &Set{FS: fs}
	var ifaces, regexes []string
	var margin time.Duration
	var name string
	s.Strings(&ifaces, "iface", "")
	s.Strings(&regexes, "iface-regex", "")
	s.Minutes(&margin, "margin", time.Hour, "")
	s.String(&name, "name", "def", "")
	if err := fs.Parse([]string{"--name=cli"}); err != nil {
		t.Fatal(err)
	}
	applied, err := ApplyPrefixed(fs, "FLANNELD")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ifaces, "|") != "eth9|eth8" || strings.Join(regexes, "|") != "^en|^eth" || margin != 45*time.Minute || name != "cli" {
		t.Fatalf("ifaces %q regexes %q margin %v name %q", ifaces, regexes, margin, name)
	}
	if strings.Join(applied, ",") != "FLANNELD_IFACE_REGEX,FLANNELD_MARGIN" {
		t.Errorf("applied %v", applied)
	}
	// The command line replaces the environment's list instead of adding to it.
	fs2 := flag.NewFlagSet("t", flag.ContinueOnError)
	s2 := &Set{FS: fs2}
	var ifaces2 []string
	s2.Strings(&ifaces2, "iface", "")
	if err := fs2.Parse([]string{"--iface=a", "--iface=b"}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(ifaces2, "|") != "a|b" {
		t.Errorf("command line ifaces %q", ifaces2)
	}
}

// TestSecretNeverShown: a password from WEFT_ETCD_PASSWORD reaches the
// client config, and --help says where it came from without showing it.
func TestSecretNeverShown(t *testing.T) {
	t.Setenv("WEFT_ETCD_PASSWORD", "s3cret")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	s := &Set{FS: fs}
	var e Etcd
	e.Register(s)
	if err := fs.Parse([]string{"--etcd-username=u"}); err != nil {
		t.Fatal(err)
	}
	if cc := e.ClientConfig(); cc.Password != "s3cret" {
		t.Fatalf("password %q, want the variable's", cc.Password)
	}
	if err := fs.Parse([]string{"--help"}); err != flag.ErrHelp {
		t.Fatalf("--help: %v", err)
	}
	if got := fs.Lookup("etcd-password").Value.String(); got != "" {
		t.Errorf("the flag's value prints as %q", got)
	}
	usage := out.String()
	if strings.Contains(usage, "s3cret") {
		t.Errorf("usage shows the password:\n%s", usage)
	}
	if !strings.Contains(usage, "(set from WEFT_ETCD_PASSWORD)") {
		t.Errorf("usage does not say where the password came from:\n%s", usage)
	}
	// The command line still overrides the variable.
	if err := fs.Parse([]string{"--etcd-password=other"}); err != nil || e.Password != "other" {
		t.Errorf("--etcd-password=other: %q, %v", e.Password, err)
	}
}
