//go:build !linux

package plugin

import (
	"errors"

	"github.com/containernetworking/cni/pkg/skel"
)

var errNotLinux = errors.New("weft CNI plugin: pods can only be wired on Linux")

func cmdAdd(*skel.CmdArgs) error    { return errNotLinux }
func cmdDel(*skel.CmdArgs) error    { return errNotLinux }
func cmdCheck(*skel.CmdArgs) error  { return errNotLinux }
func cmdGC(*skel.CmdArgs) error     { return errNotLinux }
func cmdStatus(*skel.CmdArgs) error { return errNotLinux }
