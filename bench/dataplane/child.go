package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/uvxlan"
	"github.com/weft-net/weft/vtep"
)

// nodeEnv makes the binary one node's uvxlan dataplane (modes uvxlan-proc,
// uvxlan-fast): its value is the node's nodeSpec in JSON.
const nodeEnv = "WEFT_BENCH_NODE"

// nodeProfileEnv, when set in the benchmark's environment, makes each node
// process write a CPU profile of its whole life into that directory
// (node-<local address>.pprof), for go tool pprof.
const nodeProfileEnv = "WEFT_BENCH_NODE_CPUPROFILE"

// nodeSpec is what a node process needs: its namespace, its underlay
// address and subnet, and its one peer.
type nodeSpec struct {
	NetNS      string       `json:"netns"`
	Local      netip.Addr   `json:"local"`
	Subnet     netip.Prefix `json:"subnet"`
	PeerAddr   netip.Addr   `json:"peer_addr"`
	PeerSubnet netip.Prefix `json:"peer_subnet"`
	Queues     int          `json:"queues"`
	FastPath   bool         `json:"fast_path"`
}

// runNode is the main of a node process: it runs the dataplane, writes
// "ready" to stdout once the peer is programmed, and when stdin closes
// stops and writes its Stats as JSON.
func runNode(spec string) error {
	var s nodeSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return fmt.Errorf("node spec: %w", err)
	}
	if dir := os.Getenv(nodeProfileEnv); dir != "" {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("node-%s.pprof", s.Local)))
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	dp, err := uvxlan.New(uvxlan.Config{NetNS: s.NetNS, Local: s.Local, MAC: vtep.DeviceMAC(s.Local, 1),
		MTU: overlayMTU, Subnet: s.Subnet, Queues: s.Queues, FastPath: s.FastPath}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- dp.Run(ctx) }()
	dp.Set(vtep.Table{s.PeerSubnet: {MAC: vtep.DeviceMAC(s.PeerAddr, 1), Addr: s.PeerAddr}})
	select {
	case <-dp.Ready():
	case err := <-exited:
		cancel()
		return errors.Join(errors.New("dataplane stopped"), err)
	}
	if s.FastPath && dp.Stats().Events[uvxlan.EventFastAttaches] == 0 {
		cancel()
		<-exited
		return errors.New("the fast path did not attach (see weftd's log for why: run the backend with a logger)")
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until the parent closes it
	cancel()
	if err := <-exited; err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(dp.Stats())
}

// nodeProc is a running node process.
type nodeProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *bufio.Reader
	stopped sync.Once
	stats   backend.Stats // after stop
	err     error         // of stop
}

// startNode starts a node process for n with peer and waits until it is
// ready.
func startNode(n, peer *node, queues int, fast bool) (*nodeProc, error) {
	return startNodeSpec(nodeSpec{NetNS: n.host.Path, Local: n.addr, Subnet: n.subnet,
		PeerAddr: peer.addr, PeerSubnet: peer.subnet, Queues: queues, FastPath: fast})
}

// startNodeSpec starts a node process for s and waits until it is ready.
func startNodeSpec(s nodeSpec) (*nodeProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), nodeEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	p := &nodeProc{cmd: cmd}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		p.stdin.Close()
		return nil, err
	}
	p.out = bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node process: %w", err)
	}
	line := make(chan string, 1)
	go func() { l, _ := p.out.ReadString('\n'); line <- l }()
	select {
	case l := <-line:
		if strings.TrimSpace(l) == "ready" {
			return p, nil
		}
	case <-time.After(30 * time.Second):
	}
	p.kill()
	return nil, errors.New("node process did not get ready")
}

// stop ends the node process and reads its Stats; a process that has not
// ended 30 s later is killed. Later calls return the first one's result.
func (p *nodeProc) stop() error {
	p.stopped.Do(func() {
		p.stdin.Close()
		done := make(chan error, 1)
		go func() {
			var err error
			if jerr := json.NewDecoder(p.out).Decode(&p.stats); jerr != nil {
				err = fmt.Errorf("node stats: %w", jerr)
			}
			done <- errors.Join(err, p.cmd.Wait())
		}()
		select {
		case p.err = <-done:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill() // ours, by PID
			p.err = errors.Join(errors.New("node process did not stop within 30 s; killed"), <-done)
		}
	})
	return p.err
}

func (p *nodeProc) kill() {
	p.cmd.Process.Kill() // ours, by PID
	p.cmd.Wait()
}

// cpu is the CPU time the node process has used so far.
func (p *nodeProc) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses: utime
	// and stime are the 14th and 15th of the line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", p.cmd.Process.Pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on Linux).
const clockTicks = 100

// processVXLAN runs each host's uvxlan dataplane in a process of its own,
// as weftd does, instead of both in this one; with fast, with the fast path.
func (t *topology) processVXLAN(queues int, fast bool) error {
	for _, p := range [][2]*node{{t.a, t.b}, {t.b, t.a}} {
		np, err := startNode(p[0], p[1], queues, fast)
		if err != nil {
			return err
		}
		t.addProc(np)
	}
	return nil
}

// addProc makes np one of the topology's node processes, stopped when it
// closes.
func (t *topology) addProc(np *nodeProc) {
	t.procs = append(t.procs, np)
	t.stop = append(t.stop, func() {
		if err := np.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "node process:", err)
		}
	})
}
