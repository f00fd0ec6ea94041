package fleet

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weft-net/weft/internal/etcdlocal"
)

// etcdDirEnv, when set, makes the test binary the etcd host process: it
// runs a 3-member cluster under that directory, writes its endpoints and
// the address of its metrics to files there, and stops when its stdin
// closes.
const etcdDirEnv = "WEFT_FLEET_ETCD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(etcdDirEnv); dir != "" {
		if err := serveEtcd(dir); err != nil {
			fmt.Fprintln(os.Stderr, "fleet etcd:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func serveEtcd(dir string) error {
	c, err := etcdlocal.StartCluster(dir, 3)
	if err != nil {
		return err
	}
	defer c.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go http.Serve(ln, promhttp.Handler()) // etcd registers its metrics in the default registry
	if err := os.WriteFile(filepath.Join(dir, "metrics"), []byte(ln.Addr().String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "endpoints.tmp"), []byte(strings.Join(c.Endpoints(), ",")), 0o644); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, "endpoints.tmp"), filepath.Join(dir, "endpoints")); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, os.Stdin)
	return err
}

// etcdProc is the etcd host process seen from the benchmark.
type etcdProc struct {
	cmd       *exec.Cmd
	stdin     io.Closer
	endpoints []string
	metrics   string // host:port of /metrics
}

func startEtcd(tb testing.TB) *etcdProc {
	dir := tb.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), etcdDirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &etcdProc{cmd: cmd, stdin: in}
	tb.Cleanup(func() { in.Close(); cmd.Wait() })
	exited := make(chan struct{})
	go func() { cmd.Process.Wait(); close(exited) }() //nolint:errcheck // only to notice an early exit
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if b, err := os.ReadFile(filepath.Join(dir, "endpoints")); err == nil {
			p.endpoints = strings.Split(string(b), ",")
			break
		}
		select {
		case <-exited:
			tb.Fatal("the etcd host process exited")
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatal("etcd cluster not up after a minute")
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "metrics"))
	if err != nil {
		tb.Fatal(err)
	}
	p.metrics = string(b)
	return p
}

// cpu returns the CPU time the etcd host process has used.
func (p *etcdProc) cpu(tb testing.TB) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		tb.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// rss returns the etcd host process's resident memory in MB.
func (p *etcdProc) rss(tb testing.TB) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return float64(kb) / 1024
		}
	}
	return 0
}

// requests returns the gRPC requests the etcd members have handled
// (unary calls and messages received on streams), summed over members.
func (p *etcdProc) requests(tb testing.TB) float64 {
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		unary := strings.HasPrefix(line, "grpc_server_handled_total{") && strings.Contains(line, `grpc_type="unary"`)
		stream := strings.HasPrefix(line, "grpc_server_msg_received_total{") && !strings.Contains(line, `grpc_type="unary"`)
		if !unary && !stream {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}
