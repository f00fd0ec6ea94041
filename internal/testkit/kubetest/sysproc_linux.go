package kubetest

import "syscall"

// sysProcAttr kills the child when the thread that started it dies, so that
// a crashed test binary leaves no control plane behind. startProcess forks
// from a thread it keeps locked for the child's lifetime.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
