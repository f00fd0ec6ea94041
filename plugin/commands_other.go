//go:build !linux

package plugin

import (
	"errors"
	"syscall"

	"github.com/containernetworking/cni/pkg/skel"
)

var errNotLinux = errors.New("weft CNI plugin: pods can only be wired on Linux")

func cmdAdd(*skel.CmdArgs) error               { return errNotLinux }
func cmdDel(*skel.CmdArgs, func() error) error { return errNotLinux }
func reapRetired() error                       { return errNotLinux }
func detached() *syscall.SysProcAttr           { return nil }
func cmdCheck(*skel.CmdArgs) error             { return errNotLinux }
func cmdGC(*skel.CmdArgs) error                { return errNotLinux }
func cmdStatus(*skel.CmdArgs) error            { return errNotLinux }
