package kubecluster

import (
	"syscall"
	"testing"
)

// inotifyOf counts the instance this process opens, and no more.
func TestInotifyOf(t *testing.T) {
	before := inotifyOf("/proc/self")
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if after := inotifyOf("/proc/self"); after != before+1 {
		t.Errorf("%d inotify instances open after opening one, %d before", after, before)
	}
}
