package peers

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/test/e2e"
)

// What a node pays for a daemon is its anonymous memory (heap, stacks,
// runtime metadata: pages nothing else backs) and its proportional set
// size (PSS: its resident pages, each shared page divided among the
// processes that map it). Resident file-backed pages (the executable's
// code and data) are read too, but printed apart: the kernel shares and
// reclaims them.

// mem is one reading of a process's memory, in MB, from
// /proc/PID/smaps_rollup.
type mem struct {
	anon float64 // Anonymous
	pss  float64 // Pss
	file float64 // resident file-backed pages: Rss − Anonymous
}

// readMem reads pid's memory.
func readMem(pid int) (mem, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return mem{}, err
	}
	var m mem
	var rss float64
	seen := 0
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "kB" {
			continue
		}
		kb, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Rss:":
			rss, seen = kb/1024, seen+1
		case "Pss:":
			m.pss, seen = kb/1024, seen+1
		case "Anonymous:":
			m.anon, seen = kb/1024, seen+1
		}
	}
	if seen != 3 {
		return mem{}, fmt.Errorf("/proc/%d/smaps_rollup lacks Rss, Pss or Anonymous", pid)
	}
	m.file = rss - m.anon
	return m, nil
}

// window is what sampling a process over a span found.
type window struct {
	anon, pss, file float64 // means, MB
	anonMax, pssMax float64 // the most of any sample, MB
	cpu             float64 // CPU time used over the span, in % of one core
	samples         int
}

// sampleEvery is how often a window reads the process's memory.
const sampleEvery = 200 * time.Millisecond

// sample reads pid's memory every sampleEvery for span while act (if not
// nil) runs on the calling goroutine; act is given the span's end. It
// also measures the CPU pid uses over the span.
func sample(b *testing.B, pid int, span time.Duration, act func(end time.Time)) window {
	b.Helper()
	var (
		mu      sync.Mutex
		w       window
		readErr error
	)
	stop, done := make(chan struct{}), make(chan struct{})
	var once sync.Once
	halt := func() { once.Do(func() { close(stop); <-done }) }
	defer halt() // also when act fails the benchmark
	cpu0 := cpuOf(b, pid)
	start := time.Now()
	end := start.Add(span)
	go func() {
		defer close(done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			m, err := readMem(pid)
			mu.Lock()
			if err != nil {
				readErr = err
				mu.Unlock()
				return
			}
			w.anon, w.pss, w.file = w.anon+m.anon, w.pss+m.pss, w.file+m.file
			w.anonMax, w.pssMax = max(w.anonMax, m.anon), max(w.pssMax, m.pss)
			w.samples++
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	if act != nil {
		act(end)
	}
	time.Sleep(time.Until(end))
	halt()
	elapsed := time.Since(start)
	w.cpu = 100 * (cpuOf(b, pid) - cpu0).Seconds() / elapsed.Seconds()
	if readErr != nil {
		b.Fatal(readErr)
	}
	n := float64(w.samples)
	w.anon, w.pss, w.file = w.anon/n, w.pss/n, w.file/n
	return w
}

// churnChanges and churnEvery shape the churn window: one lease change a
// second for a minute.
const (
	churnChanges = 60
	churnEvery   = time.Second
)

// churn makes churnChanges changes with change, one every churnEvery, while
// sampling pid's memory and CPU; change(i) is called at i+½ periods into
// the window.
func churn(b *testing.B, pid int, change func(i int)) window {
	b.Helper()
	return sample(b, pid, churnChanges*churnEvery, func(end time.Time) {
		start := end.Add(-churnChanges * churnEvery)
		for i := range churnChanges {
			time.Sleep(time.Until(start.Add(time.Duration(i)*churnEvery + churnEvery/2)))
			change(i)
		}
	})
}

// cpuOf is the CPU time pid has used so far (user and system).
func cpuOf(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("short /proc/%d/stat", pid)
	}
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// goMem is how weftd's Go runtime uses its memory, from the Go collector
// on its /metrics, in MB: where the anonymous memory goes.
type goMem struct {
	heapLive   float64 // heap objects, reachable or not yet collected
	heapInuse  float64 // heap spans holding objects
	heapIdle   float64 // free heap spans not yet returned to the kernel
	stacks     float64 // goroutine stacks
	meta       float64 // span, cache, GC and profiling metadata, other runtime data
	nextGC     float64 // the heap size at which the next collection starts
	goroutines float64
	ok         bool
}

// readGoMem reads weftd's Go runtime metrics on n; ok is false if it
// cannot (flanneld has no such endpoint).
func readGoMem(n *e2e.Node) goMem {
	code, body, err := n.HTTPGet("http://127.0.0.1:9470/metrics")
	if err != nil || code != 200 {
		return goMem{}
	}
	v := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || !strings.HasPrefix(f[0], "go_") {
			continue
		}
		if x, err := strconv.ParseFloat(f[1], 64); err == nil {
			v[f[0]] = x
		}
	}
	if _, ok := v["go_memstats_heap_inuse_bytes"]; !ok {
		return goMem{}
	}
	const mb = 1 << 20
	return goMem{
		heapLive:  v["go_memstats_heap_alloc_bytes"] / mb,
		heapInuse: v["go_memstats_heap_inuse_bytes"] / mb,
		heapIdle:  (v["go_memstats_heap_idle_bytes"] - v["go_memstats_heap_released_bytes"]) / mb,
		stacks:    v["go_memstats_stack_inuse_bytes"] / mb,
		meta: (v["go_memstats_mspan_inuse_bytes"] + v["go_memstats_mcache_inuse_bytes"] + v["go_memstats_gc_sys_bytes"] +
			v["go_memstats_buck_hash_sys_bytes"] + v["go_memstats_other_sys_bytes"]) / mb,
		nextGC:     v["go_memstats_next_gc_bytes"] / mb,
		goroutines: v["go_goroutines"],
		ok:         true,
	}
}

// nan marks a figure a daemon does not have.
var nan = math.NaN()
