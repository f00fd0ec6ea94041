package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/weft-net/weft/subnet"
)

// DefaultDockerEnv is where docker-opts writes dockerd's options, the same
// path as Flannel's mk-docker-opts.sh.
const DefaultDockerEnv = "/run/docker_opts.env"

// dockerOpt is one dockerd option derived from the subnet file: its
// individual variable name (DOCKER_OPT_<name>), its command-line form and its
// daemon.json key and value.
type dockerOpt struct {
	name  string
	flag  string
	key   string
	value any
}

// dockerOpts derives dockerd's network options from the subnet file. The
// order is that of the variable names, so the output is stable.
//
// --ip-masq answers FLANNEL_IPMASQ: when the daemon masquerades, Docker must
// not (its rule translates everything leaving docker0, also traffic to
// containers on other hosts); when it does not, Docker's own masquerade is
// the only one, so it is turned on explicitly. noMasq leaves it out.
func dockerOpts(f subnet.File, noMasq bool) ([]dockerOpt, error) {
	if !f.Subnet.IsValid() {
		return nil, fmt.Errorf("the subnet file has no FLANNEL_SUBNET (an IPv6-only node): dockerd's --bip needs an IPv4 subnet")
	}
	opts := []dockerOpt{{name: "BIP", flag: "--bip=" + f.Subnet.String(), key: "bip", value: f.Subnet.String()}}
	if !noMasq {
		masq := !f.IPMasq
		opts = append(opts, dockerOpt{name: "IPMASQ", flag: "--ip-masq=" + strconv.FormatBool(masq), key: "ip-masq", value: masq})
	}
	if f.MTU > 0 {
		opts = append(opts, dockerOpt{name: "MTU", flag: "--mtu=" + strconv.Itoa(f.MTU), key: "mtu", value: f.MTU})
	}
	return opts, nil
}

// renderDockerEnv renders the options as an environment file that systemd's
// EnvironmentFile= and a shell's `.` both read: DOCKER_OPT_<name> lines
// (individual) and one combined line under key.
func renderDockerEnv(opts []dockerOpt, individual, combined bool, key string) []byte {
	var b strings.Builder
	var flags []string
	for _, o := range opts {
		if individual {
			fmt.Fprintf(&b, "DOCKER_OPT_%s=\"%s\"\n", o.name, o.flag)
		}
		flags = append(flags, o.flag)
	}
	if combined {
		fmt.Fprintf(&b, "%s=\"%s\"\n", key, strings.Join(flags, " "))
	}
	return []byte(b.String())
}

// renderDaemonJSON renders the options as a daemon.json document for
// `dockerd --config-file`.
func renderDaemonJSON(opts []dockerOpt) ([]byte, error) {
	m := map[string]any{}
	for _, o := range opts {
		m[o.key] = o.value
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

const dockerOptsUsage = `usage: weftctl docker-opts [flags]

Writes dockerd's network options for this node from weftd's subnet file, the
role of Flannel's mk-docker-opts.sh (same one-letter flags):
  --bip=<FLANNEL_SUBNET>   docker0 gets the node subnet's gateway address
  --ip-masq=false          when FLANNEL_IPMASQ=true (weftd masquerades), else --ip-masq=true
  --mtu=<FLANNEL_MTU>      the overlay MTU
as an environment file (DOCKER_OPT_BIP=…, DOCKER_OPT_IPMASQ=…, DOCKER_OPT_MTU=…
and DOCKER_OPTS=… for systemd's EnvironmentFile=) and, with -daemon-json, as
a daemon.json document for "dockerd --config-file" (Docker refuses an option
given both as a flag and in its config file: use one of the two forms).
Both files are written atomically. IPv6 lines of the subnet file are not used.

Flags:
`

func runDockerOpts(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl docker-opts", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), dockerOptsUsage); fs.PrintDefaults() }
	src := fs.String("f", subnet.DefaultSubnetFile, "the subnet file to read (weftd's --subnet-file)")
	dst := fs.String("d", DefaultDockerEnv, `the environment file to write ("-": standard output)`)
	individual := fs.Bool("i", false, "write each option as its own DOCKER_OPT_<NAME> variable")
	combined := fs.Bool("c", false, "write the options combined into one variable (see -k)")
	key := fs.String("k", "DOCKER_OPTS", "the name of the combined variable")
	noMasq := fs.Bool("m", false, "leave --ip-masq out")
	daemonJSON := fs.String("daemon-json", "", `also write the options as a daemon.json document to this path ("-": standard output)`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return fmt.Errorf("%s: takes no arguments, got %q", fs.Name(), fs.Args())
	}
	if !*individual && !*combined {
		*individual, *combined = true, true
	}
	if !validEnvName(*key) {
		return fmt.Errorf("-k %q is not a valid variable name", *key)
	}
	f, err := subnet.ReadFile(*src)
	if err != nil {
		return fmt.Errorf("read the subnet file (is weftd running, with --subnet-file %s?): %w", *src, err)
	}
	opts, err := dockerOpts(f, *noMasq)
	if err != nil {
		return fmt.Errorf("%s: %w", *src, err)
	}
	if err := writeOut(*dst, renderDockerEnv(opts, *individual, *combined, *key), stdout); err != nil {
		return err
	}
	if *daemonJSON == "" {
		return nil
	}
	doc, err := renderDaemonJSON(opts)
	if err != nil {
		return err
	}
	return writeOut(*daemonJSON, doc, stdout)
}

func validEnvName(s string) bool {
	for i, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return s != ""
}

// writeOut writes data to path atomically (temporary file in the same
// directory, renamed over it, mode 0644), or to stdout when path is "-".
func writeOut(path string, data []byte, stdout io.Writer) error {
	if path == "-" {
		_, err := stdout.Write(data)
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
