package extension

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// DefaultShell runs the commands.
const DefaultShell = "/bin/sh"

// Commands are the user's commands, as the network config's Backend object
// names them.
type Commands struct {
	PreStartup, PostStartup, SubnetAdd, SubnetRemove string
}

// FromConfig returns the commands of a backend config.
func FromConfig(b subnet.BackendConfig) Commands {
	return Commands{PreStartup: b.PreStartupCommand, PostStartup: b.PostStartupCommand,
		SubnetAdd: b.SubnetAddCommand, SubnetRemove: b.SubnetRemoveCommand}
}

// Config describes the node.
type Config struct {
	Commands
	// Network and IPv6Network are the cluster networks (NETWORK).
	Network, IPv6Network netip.Prefix
	// Lease is this node's lease (PostStartupCommand's variables); rows
	// of its subnets in a table are never acted on.
	Lease subnet.Lease
	// Shell runs each command as `Shell -c <command>`; "" means
	// DefaultShell.
	Shell string
	// Env is the environment the variables are added to; nil means
	// weftd's own (os.Environ).
	Env []string
}

// Backend is the extension dataplane (see the package documentation).
type Backend struct {
	cfg             Config
	log             *slog.Logger
	*kernel.Desired // Set, Ready

	running                  atomic.Bool
	added, removed, failures atomic.Uint64

	applied vtep.Table // owned by Run: the table last acted on
}

var _ backend.Backend = (*Backend)(nil)

// New returns a backend that runs nothing until Run.
func New(cfg Config, log *slog.Logger) (*Backend, error) {
	if !cfg.Lease.Subnet.IsValid() && !cfg.Lease.IPv6Subnet.IsValid() {
		return nil, errors.New("extension config: the lease has no subnet")
	}
	if cfg.Shell == "" {
		cfg.Shell = DefaultShell
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	return &Backend{cfg: cfg, log: log.With("component", "extension"), Desired: kernel.NewDesired()}, nil
}

// PreStartup runs cmd (the PreStartupCommand) with shell ("" means
// DefaultShell) and returns what it printed, trimmed, as the JSON string
// to advertise as the lease's BackendData; "" when cmd is empty.
func PreStartup(ctx context.Context, shell, cmd string, log *slog.Logger) (string, error) {
	if cmd == "" {
		return "", nil
	}
	if shell == "" {
		shell = DefaultShell
	}
	out, err := run(ctx, shell, cmd, os.Environ(), "")
	if err != nil {
		return "", fmt.Errorf("PreStartupCommand %q: %w: %s", cmd, err, out)
	}
	log.Info("ran PreStartupCommand", "component", "extension", "command", cmd, "output", out)
	data, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("PreStartupCommand output: %w", err)
	}
	return string(data), nil
}

// Run runs the PostStartupCommand, then the peer commands for every table
// handed to Set, until ctx is done. A failed PostStartupCommand ends Run
// with its error; a failed peer command is logged and counted.
func (b *Backend) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("extension backend: already running")
	}
	defer b.running.Store(false)
	if err := b.postStartup(ctx); err != nil {
		return fmt.Errorf("extension backend: %w", err)
	}
	for {
		if tp := b.Table(); tp != nil {
			b.apply(ctx, *tp)
			if b.MarkReady() {
				b.log.Info("dataplane ready", "peers", len(b.applied))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-b.Kick():
		}
	}
}

func (b *Backend) postStartup(ctx context.Context) error {
	c := b.cfg.PostStartup
	if c == "" {
		return nil
	}
	l, network := b.cfg.Lease, b.cfg.Network
	if !network.IsValid() { // an IPv6-only network
		network = b.cfg.IPv6Network
	}
	env := append(b.cfg.Env[:len(b.cfg.Env):len(b.cfg.Env)], "NETWORK="+str(network),
		"SUBNET="+str(l.Subnet), "IPV6SUBNET="+str(l.IPv6Subnet),
		"PUBLIC_IP="+str(l.Attrs.PublicIP), "PUBLIC_IPV6="+str(l.Attrs.PublicIPv6))
	out, err := run(ctx, b.cfg.Shell, c, env, "")
	if err != nil {
		return fmt.Errorf("PostStartupCommand %q: %w: %s", c, err, out)
	}
	b.log.Info("ran PostStartupCommand", "command", c, "output", out)
	return nil
}

// apply runs the peer commands that turn the table last acted on into t:
// removals first, then for each changed row removal of the old and addition
// of the new, then additions, each in subnet order.
func (b *Backend) apply(ctx context.Context, t vtep.Table) {
	t = b.withoutSelf(t)
	d := vtep.Compute(b.applied, t)
	for _, e := range d.Remove {
		b.peerCommand(ctx, "SubnetRemoveCommand", b.cfg.SubnetRemove, e, &b.removed)
	}
	for _, c := range d.Change {
		b.peerCommand(ctx, "SubnetRemoveCommand", b.cfg.SubnetRemove, vtep.Entry{Subnet: c.Subnet, Peer: c.Old}, &b.removed)
		b.peerCommand(ctx, "SubnetAddCommand", b.cfg.SubnetAdd, vtep.Entry{Subnet: c.Subnet, Peer: c.New}, &b.added)
	}
	for _, e := range d.Add {
		b.peerCommand(ctx, "SubnetAddCommand", b.cfg.SubnetAdd, e, &b.added)
	}
	b.applied = t
}

// peerCommand runs one peer command for e, if there is one.
func (b *Backend) peerCommand(ctx context.Context, name, cmd string, e vtep.Entry, ran *atomic.Uint64) {
	if cmd == "" || ctx.Err() != nil {
		return
	}
	stdin, err := dataString(e.Peer.Data)
	if err != nil {
		b.failures.Add(1)
		b.log.Error("peer's backend data is not a JSON string, command not run", "command", name,
			"subnet", e.Subnet, "publicIP", e.Peer.Addr, "data", e.Peer.Data, "err", err)
		return
	}
	env := append(b.cfg.Env[:len(b.cfg.Env):len(b.cfg.Env)], peerEnv(e)...)
	out, err := run(ctx, b.cfg.Shell, cmd, env, stdin)
	ran.Add(1)
	if err != nil {
		b.failures.Add(1)
		b.log.Error("command failed", "command", name, "subnet", e.Subnet, "publicIP", e.Peer.Addr, "err", err, "output", out)
		return
	}
	b.log.Info("ran command", "command", name, "subnet", e.Subnet, "publicIP", e.Peer.Addr, "output", out)
}

// peerEnv is the variables of a peer command for row e.
func peerEnv(e vtep.Entry) []string {
	if e.Subnet.Addr().Is4() {
		return []string{"SUBNET=" + str(e.Subnet), "PUBLIC_IP=" + str(e.Peer.Addr), "IPV6SUBNET=", "PUBLIC_IPV6="}
	}
	return []string{"SUBNET=", "PUBLIC_IP=", "IPV6SUBNET=" + str(e.Subnet), "PUBLIC_IPV6=" + str(e.Peer.Addr)}
}

// dataString decodes a lease's BackendData (JSON text, "" for none) into
// the string Flannel's extension backend stores there.
func dataString(data string) (string, error) {
	if data == "" || data == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal([]byte(data), &s); err != nil {
		return "", err
	}
	return s, nil
}

// withoutSelf drops rows of this node's own subnets or addresses.
func (b *Backend) withoutSelf(t vtep.Table) vtep.Table {
	l := b.cfg.Lease
	self := func(p netip.Prefix, v vtep.Peer) bool {
		return p == l.Subnet.Masked() || p == l.IPv6Subnet.Masked() ||
			(v.Addr.IsValid() && (v.Addr == l.Attrs.PublicIP || v.Addr == l.Attrs.PublicIPv6))
	}
	out := maps.Clone(t)
	maps.DeleteFunc(out, self)
	return out
}

// outputWait is how long run waits, once the shell has exited, for the
// processes it started in the background to close its output.
const outputWait = 5 * time.Second

// run runs cmd with shell, env and stdin plus a newline (as Flannel writes
// it), and returns its output (stdout and stderr), trimmed. The shell runs
// in a process group of its own: when ctx is done the whole group is
// killed, and a process the command left in the background that keeps the
// output open holds run up for at most outputWait (its output after that is
// lost), so that no command can hang the daemon.
func run(ctx context.Context, shell, cmd string, env []string, stdin string) (string, error) {
	c := exec.CommandContext(ctx, shell, "-c", cmd)
	c.Env = env
	c.Stdin = strings.NewReader(stdin + "\n")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = outputWait
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil // the shell succeeded; a background process kept its output
	}
	return strings.TrimSpace(out.String()), err
}

// str is v's text, or "" when v is the zero value (an absent address or
// subnet).
func str[T interface {
	IsValid() bool
	String() string
}](v T) string {
	if !v.IsValid() {
		return ""
	}
	return v.String()
}

// Stats counts the peer commands run (Events "subnet_add",
// "subnet_remove") and those that failed or could not run
// ("command_failed"). The extension backend has no device and counts no
// frames.
func (b *Backend) Stats() backend.Stats {
	return backend.Stats{Events: map[string]uint64{
		"subnet_add": b.added.Load(), "subnet_remove": b.removed.Load(), "command_failed": b.failures.Load()}}
}
