package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

const (
	cpuacct  = "/sys/fs/cgroup/cpuacct"
	cpuCG    = "/sys/fs/cgroup/cpu"
	memoryCG = "/sys/fs/cgroup/memory"
)

// cpuSeconds is the CPU time the cgroup cg (a path in the cpuacct
// hierarchy) and its descendants have used.
func cpuSeconds(cg string) (float64, error) {
	b, err := os.ReadFile(filepath.Join(cpuacct, cg, "cpuacct.usage"))
	if err != nil {
		return 0, fmt.Errorf("cgroup cpu: %w", err)
	}
	ns, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	return ns / 1e9, err
}

// workingSet is the cgroup's memory as kubelet's metrics (kubectl top)
// count it: usage less inactive file pages, in MiB; and how much of it is
// shared memory (tmpfs files the pod wrote: on the bench's nodes, whose
// /opt is a tmpfs, the CNI plugin binary its init container copied).
func workingSet(cg string) (ws, shmem float64, err error) {
	b, err := os.ReadFile(filepath.Join(memoryCG, cg, "memory.usage_in_bytes"))
	if err != nil {
		return 0, 0, fmt.Errorf("cgroup memory: %w", err)
	}
	usage, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		return 0, 0, err
	}
	st, err := os.ReadFile(filepath.Join(memoryCG, cg, "memory.stat"))
	if err != nil {
		return 0, 0, err
	}
	found := 0
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "total_inactive_file "); ok {
			inactive, _ := strconv.ParseFloat(v, 64)
			usage = max(0, usage-inactive)
			found++
		}
		if v, ok := strings.CutPrefix(l, "total_shmem "); ok {
			shmem, _ = strconv.ParseFloat(v, 64)
			found++
		}
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("cgroup memory: %s has no total_inactive_file or total_shmem", filepath.Join(memoryCG, cg, "memory.stat"))
	}
	return usage / (1 << 20), shmem / (1 << 20), nil
}

// podCgroup finds, under the node's cgroup root, the pod cgroup of the pod
// with uid (cgroupfs "pod<uid>" or systemd "…pod<uid with _>.slice").
func podCgroup(nodeCG, uid string) (string, error) {
	want := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	var found string
	err := filepath.WalkDir(filepath.Join(cpuacct, nodeCG), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		for _, w := range want {
			if name := d.Name(); name == w || strings.HasSuffix(name, "-"+w+".slice") {
				found = strings.TrimPrefix(p, cpuacct)
				return filepath.SkipAll
			}
		}
		return nil
	})
	if err == nil && found == "" {
		err = errors.New("no pod cgroup for " + uid)
	}
	return found, err
}

// measurement is one test's figures in one round.
type measurement struct {
	round      int
	load       string  // load average when the test started
	gbps       float64 // received
	lossPct    float64 // UDP
	retrans    float64 // TCP retransmissions per second
	p50, p99   float64 // µs, request/response
	rate       float64 // transactions (rr) or connections (crr) per second
	cpuSrv     float64 // CPU-seconds per second, the server's node
	cpuCli     float64 // the client's node
	wall, secs float64
}

// test is one row group of the matrix.
type test struct {
	name string
	tool string // "iperf3" or "rr"
	args func(addr string, secs int) []string
}

var tests = []test{
	{"TCP 1 stream", "iperf3", func(a string, s int) []string {
		return []string{"-c", a, "-t", strconv.Itoa(s), "-O", "1", "-Z", "--dont-fragment", "-J"}
	}},
	{"TCP 8 streams", "iperf3", func(a string, s int) []string {
		return []string{"-c", a, "-t", strconv.Itoa(s), "-O", "1", "-Z", "--dont-fragment", "-P", "8", "-J"}
	}},
	{"UDP", "iperf3", func(a string, s int) []string {
		return []string{"-c", a, "-u", "-b", "0", "-t", strconv.Itoa(s), "-O", "1", "-J"}
	}},
	{"TCP RR", "rr", func(a string, s int) []string {
		return []string{"rr", "-addr", fmt.Sprintf("%s:%d", a, rrPort), "-d", fmt.Sprintf("%ds", s)}
	}},
	{"TCP CRR", "rr", func(a string, s int) []string {
		return []string{"crr", "-addr", fmt.Sprintf("%s:%d", a, rrPort), "-d", fmt.Sprintf("%ds", s)}
	}},
}

// parse reads a tool's JSON output into m.
func (t test) parse(out []byte, m *measurement) error {
	if t.tool == "rr" {
		var r struct {
			Rate  float64 `json:"rate"`
			P50us float64 `json:"p50_us"`
			P99us float64 `json:"p99_us"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			return fmt.Errorf("rr output %q: %w", out, err)
		}
		m.rate, m.p50, m.p99 = r.Rate, r.P50us, r.P99us
		return nil
	}
	var r struct {
		End struct {
			Sum struct {
				BPS  float64 `json:"bits_per_second"`
				Lost float64 `json:"lost_percent"`
			} `json:"sum"`
			Received *struct {
				BPS float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			Sent *struct {
				Seconds    float64 `json:"seconds"`
				Retransmit float64 `json:"retransmits"`
			} `json:"sum_sent"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return fmt.Errorf("iperf3 output: %w: %.300s", err, out)
	}
	if r.Error != "" {
		return fmt.Errorf("iperf3: %s", r.Error)
	}
	switch {
	case r.End.Received != nil && r.End.Received.BPS > 0:
		m.gbps = r.End.Received.BPS / 1e9
	default: // UDP in iperf3 3.12: the sender's rate less what was lost
		m.gbps = r.End.Sum.BPS * (1 - r.End.Sum.Lost/100) / 1e9
	}
	m.lossPct = r.End.Sum.Lost
	if s := r.End.Sent; s != nil && s.Seconds > 0 {
		m.retrans = s.Retransmit / s.Seconds
	}
	return nil
}

// warmup is how long after the client's start the CPU window opens (the
// client's exec and iperf3's omitted first second fall before it); every
// client runs warmup and a second longer than the window.
const warmup = 3 * time.Second

// clientSeconds is how long a client runs for a CPU window of secs.
func clientSeconds(secs int) int { return secs + int(warmup/time.Second) + 1 }

// run runs t from c's client to addr for clientSeconds(secs), and measures
// the two nodes' CPU over secs from warmup on, while the traffic flows;
// with prof set, perf records the whole machine's stacks over that window
// into it.
func (c *column) run(ctx context.Context, t test, addr string, secs int, prof string) (measurement, error) {
	m := measurement{load: benchreport.LoadAvg(" "), secs: float64(secs)}
	tctx, cancel := context.WithTimeout(ctx, time.Duration(secs+60)*time.Second+warmup)
	defer cancel()
	cmd := c.client(tctx, t.tool, t.args(addr, clientSeconds(secs)))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	fail := func(err error) (measurement, error) {
		return m, fmt.Errorf("%s %s: %s: %w: %s %.500s", c.label, t.name, strings.Join(cmd.Args, " "), err, stderr.String(), out.String())
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	time.Sleep(warmup)
	cpu0, err := c.nodesCPU()
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	var perf *exec.Cmd
	var perfErr bytes.Buffer
	if prof != "" {
		perf = exec.Command("perf", "record", "-q", "-e", "cpu-clock", "-a", "-g", "-o", prof, "--", "sleep", strconv.Itoa(secs))
		perf.Stderr = &perfErr
		if err := perf.Start(); err != nil {
			return fail(fmt.Errorf("perf: %w", err))
		}
		defer func() { // on a path that did not wait for it: perf ends its file on SIGINT
			if perf.ProcessState == nil {
				_ = perf.Process.Signal(os.Interrupt)
				_ = perf.Wait()
			}
		}()
	}
	select {
	case err := <-done:
		return fail(fmt.Errorf("ended before its CPU window did: %v", err))
	case <-time.After(time.Duration(secs) * time.Second):
	}
	cpu1, err := c.nodesCPU()
	if err != nil {
		return fail(err)
	}
	m.wall = time.Since(t0).Seconds()
	m.cpuSrv, m.cpuCli = (cpu1[0]-cpu0[0])/m.wall, (cpu1[1]-cpu0[1])/m.wall
	if perf != nil {
		if err := perf.Wait(); err != nil {
			return fail(fmt.Errorf("perf: %w: %s", err, perfErr.String()))
		}
	}
	if err := <-done; err != nil {
		return fail(err)
	}
	if err := t.parse(out.Bytes(), &m); err != nil {
		return fail(err)
	}
	return m, nil
}

// nodesCPU is the CPU time the server's and the client's node have used.
func (c *column) nodesCPU() ([2]float64, error) {
	var v [2]float64
	for i, cg := range c.nodeCG {
		s, err := cpuSeconds(cg)
		if err != nil {
			return v, err
		}
		v[i] = s
	}
	return v, nil
}

// atRest is the CNI pods' figures over one window with no bench traffic.
type atRest struct {
	round int
	cpu   float64 // millicores per pod (mean of the two nodes' pods)
	mem   float64 // working set, MiB per pod (mean)
	shmem float64 // of mem, shared memory (mean)
}

// restWindow measures every column's CNI pods over the same window.
func restWindow(ctx context.Context, cols []*column, d time.Duration) (map[*column]atRest, error) {
	before := map[*column][]float64{}
	for _, c := range cols {
		for _, cg := range c.cniCG {
			v, err := cpuSeconds(cg)
			if err != nil {
				return nil, err
			}
			before[c] = append(before[c], v)
		}
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(d):
	}
	wall := time.Since(t0).Seconds()
	out := map[*column]atRest{}
	for _, c := range cols {
		var r atRest
		for i, cg := range c.cniCG {
			v, err := cpuSeconds(cg)
			if err != nil {
				return nil, err
			}
			mem, shmem, err := workingSet(cg)
			if err != nil {
				return nil, err
			}
			r.shmem += shmem / float64(len(c.cniCG))
			r.cpu += (v - before[c][i]) / wall * 1000 / float64(len(c.cniCG))
			r.mem += mem / float64(len(c.cniCG))
		}
		if len(c.cniCG) > 0 {
			out[c] = r
		}
	}
	return out, nil
}
