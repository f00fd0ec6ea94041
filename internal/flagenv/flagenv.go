// Package flagenv defines command-line flags that fall back to WEFT_*
// environment variables (WEFT_ plus the flag name in upper case, dashes as
// underscores), and the etcd connection flags that weftd and weftctl share.
// Flags are registered here and parsed by the commands in cmd/.
package flagenv

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/weft-net/weft/subnet/etcd"
)

// Name is the environment variable for a flag: "etcd-endpoints" →
// "WEFT_ETCD_ENDPOINTS".
func Name(flagName string) string {
	return "WEFT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Set registers flags on a FlagSet with environment defaults, and collects
// the errors of environment values that do not parse.
type Set struct {
	FS   *flag.FlagSet
	errs []error
}

// String registers a string flag whose default is $WEFT_<NAME>, else def.
func (s *Set) String(p *string, name, def, usage string) {
	if v, ok := os.LookupEnv(Name(name)); ok {
		def = v
	}
	s.FS.StringVar(p, name, def, usage)
}

// Secret registers a string flag for a secret, such as a password, whose
// default is $WEFT_<NAME>, else empty. Its value is never shown: the usage
// says only that the variable set it, the flag's String (and so its
// default in the usage) is empty, and setting it never fails, so no parse
// error can quote it.
func (s *Set) Secret(p *string, name, usage string) {
	if v, ok := os.LookupEnv(Name(name)); ok {
		*p = v
		usage += " (set from " + Name(name) + ")"
	}
	s.FS.Var((*secretValue)(p), name, usage)
}

// secretValue is the flag.Value of a Secret flag.
type secretValue string

func (v *secretValue) String() string { return "" }

func (v *secretValue) Set(s string) error {
	*v = secretValue(s)
	return nil
}

// Bool registers a boolean flag whose default is $WEFT_<NAME>, else def.
func (s *Set) Bool(p *bool, name string, def bool, usage string) {
	if v, ok := os.LookupEnv(Name(name)); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: not a boolean", Name(name), v))
		}
		def = b
	}
	s.FS.BoolVar(p, name, def, usage)
}

// Duration registers a duration flag whose default is $WEFT_<NAME>, else def.
func (s *Set) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	if v, ok := os.LookupEnv(Name(name)); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: not a duration", Name(name), v))
		}
		def = d
	}
	s.FS.DurationVar(p, name, def, usage)
}

// Err returns the environment values that did not parse.
func (s *Set) Err() error {
	if len(s.errs) == 0 {
		return nil
	}
	return errors.Join(s.errs...)
}

// Etcd holds the etcd connection flags.
type Etcd struct {
	// DefaultEndpoints, if set before Register, replaces the default of
	// --etcd-endpoints (flanneld's is http://127.0.0.1:4001,http://127.0.0.1:2379).
	DefaultEndpoints string

	Endpoints, Prefix         string
	CAFile, CertFile, KeyFile string
	Username, Password        string
}

// Register adds --etcd-endpoints, --etcd-prefix, --etcd-cafile,
// --etcd-certfile, --etcd-keyfile, --etcd-username and --etcd-password.
func (e *Etcd) Register(s *Set) {
	def := "http://127.0.0.1:2379"
	if e.DefaultEndpoints != "" {
		def = e.DefaultEndpoints
	}
	s.String(&e.Endpoints, "etcd-endpoints", def, "comma-separated etcd endpoints (http://, https:// or unix://)")
	s.String(&e.Prefix, "etcd-prefix", etcd.DefaultPrefix, "etcd prefix holding config and subnets/")
	s.String(&e.CAFile, "etcd-cafile", "", "CA certificate for etcd TLS")
	s.String(&e.CertFile, "etcd-certfile", "", "client certificate for etcd TLS")
	s.String(&e.KeyFile, "etcd-keyfile", "", "client key for etcd TLS")
	s.String(&e.Username, "etcd-username", "", "etcd user name")
	s.Secret(&e.Password, "etcd-password", "etcd `password`")
}

// ClientConfig is the etcd client configuration the flags describe.
func (e *Etcd) ClientConfig() etcd.ClientConfig {
	return etcd.ClientConfig{
		Endpoints: strings.Split(e.Endpoints, ","),
		CAFile:    e.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile,
		Username: e.Username, Password: e.Password,
	}
}

// Int registers an integer flag whose default is $WEFT_<NAME>, else def.
func (s *Set) Int(p *int, name string, def int, usage string) {
	if v, ok := os.LookupEnv(Name(name)); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: not an integer", Name(name), v))
		}
		def = n
	}
	s.FS.IntVar(p, name, def, usage)
}

// Strings registers a repeatable string flag: every occurrence on the
// command line appends one value, in order. Its default is $WEFT_<NAME>
// split at commas, else empty; the first value given on the command line
// replaces that default.
func (s *Set) Strings(p *[]string, name, usage string) {
	v := &stringsValue{p: p}
	if env, ok := os.LookupEnv(Name(name)); ok && env != "" {
		*p = splitList(env)
		v.isDefault = true
	}
	s.FS.Var(v, name, usage)
}

type stringsValue struct {
	p         *[]string
	isDefault bool
}

func (v *stringsValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v *stringsValue) Set(s string) error {
	if v.isDefault {
		*v.p, v.isDefault = nil, false
	}
	*v.p = append(*v.p, s)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Minutes registers a duration flag that also takes a bare integer as a
// number of minutes, the unit flanneld uses for the same flag ("60" and
// "1h" both mean one hour). Its default is $WEFT_<NAME>, else def.
func (s *Set) Minutes(p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	v := (*minutesValue)(p)
	if env, ok := os.LookupEnv(Name(name)); ok {
		if err := v.Set(env); err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: %w", Name(name), env, err))
		}
	}
	s.FS.Var(v, name, usage)
}

type minutesValue time.Duration

func (m *minutesValue) String() string {
	if m == nil {
		return ""
	}
	return time.Duration(*m).String()
}

func (m *minutesValue) Set(s string) error {
	if n, err := strconv.Atoi(s); err == nil {
		*m = minutesValue(time.Duration(n) * time.Minute)
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a number of minutes or a duration (60, 1h30m)")
	}
	*m = minutesValue(d)
	return nil
}

// ApplyPrefixed sets, after fs has parsed the command line, every flag that
// was neither given on the command line nor has a $WEFT_<NAME> variable from
// the variable prefix_<NAME> (NAME as for Name), if that is set and not
// empty. This is how flanneld reads its FLANNELD_<FLAG> variables, so a unit
// file or DaemonSet written for flanneld keeps working. It returns the names
// of the variables it applied, in flag order.
func ApplyPrefixed(fs *flag.FlagSet, prefix string) ([]string, error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var applied []string
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		if _, ok := os.LookupEnv(Name(f.Name)); ok {
			return
		}
		key := prefix + strings.TrimPrefix(Name(f.Name), "WEFT")
		v := os.Getenv(key)
		if v == "" {
			return
		}
		for _, part := range envValues(f, v) {
			if err := fs.Set(f.Name, part); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", key, v, err))
				return
			}
		}
		applied = append(applied, key)
	})
	return applied, errors.Join(errs...)
}

// envValues splits a repeatable flag's variable at commas; any other flag
// takes the value whole.
func envValues(f *flag.Flag, v string) []string {
	if _, ok := f.Value.(*stringsValue); ok {
		return splitList(v)
	}
	return []string{v}
}

// Lookup returns $WEFT_<NAME> for the flag name, or "" when unset.
func Lookup(flagName string) string { return os.Getenv(Name(flagName)) }
