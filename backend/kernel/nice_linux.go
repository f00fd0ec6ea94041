package kernel

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// SetProcessNice gives every thread of this process the nice value n.
// Linux keeps a nice value per thread, and a new thread takes its
// creator's, so once every thread has n the Go runtime's later threads
// have it too; a thread created during the change is caught by a second
// pass. A dataplane that forwards packets in userspace (uvxlan) calls for
// it: the kernel's own dataplane runs in softirq, ahead of every process,
// while a userspace one at the default nice value gets only its fair share
// of a CPU that the pods keep busy. Processes started afterwards inherit
// n as well. Lowering the value needs CAP_SYS_NICE.
func SetProcessNice(n int) error {
	if n < -20 || n > 19 {
		return fmt.Errorf("nice %d out of range -20..19", n)
	}
	for range 2 {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("set nice %d: %w", n, err)
		}
		var errs []error
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("set nice %d: %w", n, err)
		}
	}
	return nil
}

// ThreadNice returns the nice value of thread tid (0: the calling thread).
func ThreadNice(tid int) (int, error) {
	v, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return 0, err
	}
	return 20 - v, nil // the system call returns 20 - nice
}
