package kubetest

import "syscall"

// sysProcAttr kills the child when the test binary's thread that started it
// dies, so that a crashed test leaves no control plane behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
