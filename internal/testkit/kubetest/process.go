package kubetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// process is one control-plane binary started by this package.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	err     error         // its exit status, valid after done
}

// startProcess starts path with args, logging to dir/<name>.log, and stops
// it by PID when t ends: SIGTERM, then SIGKILL after 10 s. The child also
// gets SIGKILL if the test binary dies first.
func startProcess(t testing.TB, dir, name, path string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("kubetest: start %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = dir
	cmd.SysProcAttr = sysProcAttr()
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The child's death signal follows the thread that forked it, and
		// Go ends a thread when a goroutine locked to it exits (namespace
		// code does that on purpose). Fork from a thread locked here until
		// the child is gone, so no other goroutine can take it over.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		logf.Close()
		return nil, fmt.Errorf("kubetest: start %s: %w", name, err)
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("kubetest: %s log (tail):\n%s", name, p.logTail())
		}
	})
	return p, nil
}

// stop ends the process by its PID and waits for it.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// logTail returns the last few KB of the process's log.
func (p *process) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return errors.Unwrap(err).Error()
	}
	const max = 4096
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
