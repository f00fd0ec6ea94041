package e2e

import (
	"syscall"
	"time"
)

// Kill sends SIGKILL to weftd (the process started by Start) and waits for
// it to exit: a crash, with no chance to clean up.
func (n *Node) Kill() {
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		n.c.T.Errorf("weftd on %s did not exit within 10s of SIGKILL", n.Label)
	}
	n.cmd = nil
}
