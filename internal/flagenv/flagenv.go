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
	Endpoints, Prefix         string
	CAFile, CertFile, KeyFile string
	Username, Password        string
}

// Register adds --etcd-endpoints, --etcd-prefix, --etcd-cafile,
// --etcd-certfile, --etcd-keyfile, --etcd-username and --etcd-password.
func (e *Etcd) Register(s *Set) {
	s.String(&e.Endpoints, "etcd-endpoints", "http://127.0.0.1:2379", "comma-separated etcd endpoints (http://, https:// or unix://)")
	s.String(&e.Prefix, "etcd-prefix", etcd.DefaultPrefix, "etcd prefix holding config and subnets/")
	s.String(&e.CAFile, "etcd-cafile", "", "CA certificate for etcd TLS")
	s.String(&e.CertFile, "etcd-certfile", "", "client certificate for etcd TLS")
	s.String(&e.KeyFile, "etcd-keyfile", "", "client key for etcd TLS")
	s.String(&e.Username, "etcd-username", "", "etcd user name")
	s.String(&e.Password, "etcd-password", "", "etcd password")
}

// ClientConfig is the etcd client configuration the flags describe.
func (e *Etcd) ClientConfig() etcd.ClientConfig {
	return etcd.ClientConfig{
		Endpoints: strings.Split(e.Endpoints, ","),
		CAFile:    e.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile,
		Username: e.Username, Password: e.Password,
	}
}
