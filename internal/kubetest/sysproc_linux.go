package kubetest

import "syscall"

// sysProcAttr kills the child when the thread that started it dies, so that
// a crashed test binary leaves no control plane behind. (Go ends a thread
// only when a goroutine locked to it exits: do not start clusters from a
// goroutine that calls runtime.LockOSThread without unlocking.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
