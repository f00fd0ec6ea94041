package weftd

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// rssFileKB is this process's resident file-backed memory (RssFile).
func rssFileKB(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "RssFile:" {
			kb, _ := strconv.Atoi(f[1])
			return kb
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestPageOutExecutable: the test binary's read-only mappings are paged
// out, and most of its resident file pages go (the ones the test itself
// runs meanwhile come back).
func TestPageOutExecutable(t *testing.T) {
	before := rssFileKB(t)
	if before < 2048 {
		t.Fatalf("only %d KB of the test binary resident before: the test proves nothing", before)
	}
	n, err := pageOutExecutable()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFileKB(t)
	exe, err := os.Stat("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if n <= 0 || int64(n) > exe.Size()+1<<20 {
		t.Fatalf("advised %d bytes of mappings of a %d-byte executable", n, exe.Size())
	}
	if after > before/2 {
		t.Fatalf("resident file pages %d KB before, %d KB after paging out the executable", before, after)
	}
	t.Logf("resident file pages %d KB → %d KB (%d bytes of mappings advised)", before, after, n)
}

func TestExeMapping(t *testing.T) {
	dev := unix.Mkdev(0xfd, 0x01)
	for _, tc := range []struct {
		line   string
		ok     bool
		lo, hi uintptr
	}{
		{"00400000-00c35000 r-xp 00000000 fd:01 1234 /usr/bin/weftd", true, 0x400000, 0xc35000},
		{"00c35000-015dd000 r--p 00835000 fd:01 1234 /usr/bin/weftd (deleted)", true, 0xc35000, 0x15dd000},
		{"015dd000-01659000 rw-p 011dd000 fd:01 1234 /usr/bin/weftd", false, 0, 0},
		{"00400000-00c35000 r-xp 00000000 fd:01 999 /usr/bin/other", false, 0, 0},
		{"00400000-00c35000 r-xp 00000000 fd:02 1234 /other/fs/weftd", false, 0, 0},
		{"7f2675e01000-7f2675e97000 rw-p 00000000 00:00 0", false, 0, 0},
		{"garbage", false, 0, 0},
	} {
		lo, hi, ok := exeMapping(tc.line, dev, 1234)
		if ok != tc.ok || lo != tc.lo || hi != tc.hi {
			t.Errorf("exeMapping(%q) = %#x, %#x, %v; want %#x, %#x, %v", tc.line, lo, hi, ok, tc.lo, tc.hi, tc.ok)
		}
	}
}

// TestExeMappingsPrivate: of the executable's read-only mappings in smaps,
// one that holds private copies of pages (a PIE build's relocated
// read-only data) is marked, so that it is paged out but not unmapped.
func TestExeMappingsPrivate(t *testing.T) {
	const smaps = `00400000-00c35000 r-xp 00000000 fd:01 1234 /usr/bin/weftd
Size:               8404 kB
Rss:                7636 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me dw sd
00c35000-015dd000 r--p 00835000 fd:01 1234 /usr/bin/weftd
Size:               9888 kB
Anonymous:           120 kB
VmFlags: rd mr mw me dw sd
015dd000-01659000 rw-p 011dd000 fd:01 1234 /usr/bin/weftd
Anonymous:           124 kB
01659000-036a0000 rw-p 00000000 00:00 0
Anonymous:           120 kB
7f0000000000-7f0000010000 r--p 00000000 fd:01 999 /usr/lib/other.so
Anonymous:             0 kB
`
	got, err := exeMappings(strings.NewReader(smaps), unix.Mkdev(0xfd, 0x01), 1234)
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{{lo: 0x400000, hi: 0xc35000}, {lo: 0xc35000, hi: 0x15dd000, private: true}}
	if !slices.Equal(got, want) {
		t.Fatalf("exeMappings = %+v, want %+v", got, want)
	}
}
