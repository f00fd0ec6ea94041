// Command install-conf installs a file atomically: it copies <src> to a
// hidden temporary file beside <dest> and renames it over <dest>, so that a
// reader (the container runtime watching /etc/cni/net.d) never sees a
// half-written file. weft's image serves it at /opt/bin/install-conf, the
// path and usage of Flannel's image, so Flannel's manifest runs unchanged:
//
//	/opt/bin/install-conf /etc/kube-flannel/cni-conf.json /etc/cni/net.d/10-flannel.conflist
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "install-conf:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: install-conf <src> <dest>")
	}
	return install(args[0], args[1])
}

// install copies src to dest through a temporary file in dest's directory.
func install(src, dest string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".tmp")
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, dest); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
