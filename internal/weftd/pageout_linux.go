package weftd

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// pageOutExecutable gives back the pages of weftd's own executable that
// weftd maps read-only (code and read-only data: everything but the data
// segment), and returns how many bytes of mappings it advised. It asks the
// kernel to reclaim them now (MADV_PAGEOUT), which is what the kernel does
// to them anyway when memory runs short, and then unmaps what it could not
// reclaim at once (MADV_DONTNEED: pages still in a CPU's batch of new
// pages, or mapped by another process too), which stays in the page cache,
// no longer counted as weftd's and first to go when memory is short. Most
// of those pages ran once, at start-up (package initialisation, the
// datastore's client and its TLS, the lease, the first sync); the ones
// weftd goes on running come back as it runs them.
//
// Nothing is lost: a page of the file comes back as it was. A read-only
// mapping can hold private copies, though: a position-independent or
// dynamically linked build has its relocated read-only data (RELRO)
// written by the loader, and a debugger's breakpoint or a uprobe is a
// private copy of a code page. Those copies would be thrown away by
// MADV_DONTNEED, so a mapping that holds any (its Anonymous pages in
// /proc/self/smaps) is only paged out, which keeps them.
//
// First it marks the mappings as read at random (MADV_RANDOM), so that a
// page read back from the file later comes alone, not with the readahead
// around it in one large folio that the fault then maps whole: with
// readahead, the pages weftd runs at rest came back as 9.4 MB of mappings,
// without it as 4.6 MB (bench/peers, 2026-12-01, once the page cache held
// the file as read from disk, not as written by the build).
//
// With 5,000 peers weftd kept 16.6 MB of its executable mapped at rest,
// nearly all of its code and read-only data: the kernel maps pages of a
// file in 64 KB windows around each one touched, and start-up touches
// something in almost every window.
func pageOutExecutable() (int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("page out the executable: %w", err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("page out the executable: %w", err)
	}
	ms, err := exeMappings(f, uint64(st.Dev), uint64(st.Ino))
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("page out the executable: %w", err)
	}
	advised := 0
	for _, m := range ms {
		advice := []uintptr{unix.MADV_RANDOM, unix.MADV_PAGEOUT}
		if !m.private {
			advice = append(advice, unix.MADV_DONTNEED)
		}
		for _, a := range advice {
			if _, _, e := unix.Syscall(unix.SYS_MADVISE, m.lo, m.hi-m.lo, a); e != 0 {
				return advised, fmt.Errorf("page out the executable: madvise %d: %w", a, e)
			}
		}
		advised += int(m.hi - m.lo)
	}
	return advised, nil
}

// mapping is one read-only mapping of the executable; private says that it
// holds private copies of pages (Anonymous in smaps).
type mapping struct {
	lo, hi  uintptr
	private bool
}

// exeMappings reads /proc/self/smaps and returns the mappings of the file
// dev/ino that are not writable.
func exeMappings(smaps io.Reader, dev, ino uint64) ([]mapping, error) {
	var out []mapping
	var cur *mapping
	sc := bufio.NewScanner(smaps)
	for sc.Scan() {
		line := sc.Text()
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.Contains(k, " ") {
			// A field of the mapping above: "Anonymous:      12 kB".
			if f := strings.Fields(v); cur != nil && k == "Anonymous" && len(f) > 0 && f[0] != "0" {
				cur.private = true
			}
			continue
		}
		cur = nil
		if lo, hi, ok := exeMapping(line, dev, ino); ok {
			out = append(out, mapping{lo: lo, hi: hi})
			cur = &out[len(out)-1]
		}
	}
	return out, sc.Err()
}

// exeMapping parses one line of /proc/self/maps ("start-end perms offset
// major:minor inode path") and reports the range of a mapping of the file
// dev/ino that is not writable.
func exeMapping(line string, dev, ino uint64) (lo, hi uintptr, ok bool) {
	f := strings.Fields(line)
	if len(f) < 6 || len(f[1]) < 2 || f[1][1] == 'w' {
		return 0, 0, false
	}
	if n, err := strconv.ParseUint(f[4], 10, 64); err != nil || n != ino {
		return 0, 0, false
	}
	major, minor, found := strings.Cut(f[3], ":")
	ma, err1 := strconv.ParseUint(major, 16, 32)
	mi, err2 := strconv.ParseUint(minor, 16, 32)
	if !found || err1 != nil || err2 != nil || unix.Mkdev(uint32(ma), uint32(mi)) != dev {
		return 0, 0, false
	}
	start, end, found := strings.Cut(f[0], "-")
	l, err1 := strconv.ParseUint(start, 16, 64)
	h, err2 := strconv.ParseUint(end, 16, 64)
	if !found || err1 != nil || err2 != nil || h <= l {
		return 0, 0, false
	}
	return uintptr(l), uintptr(h), true
}
