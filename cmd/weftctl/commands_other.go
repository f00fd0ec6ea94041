//go:build !linux

package main

import (
	"context"
	"errors"
	"io"
)

var errLinuxOnly = errors.New("this command reads Linux network namespaces and netlink: run it on a Linux node")

func runPeers(context.Context, []string, io.Writer, io.Writer) error   { return errLinuxOnly }
func runExplain(context.Context, []string, io.Writer, io.Writer) error { return errLinuxOnly }
func runLab(context.Context, []string, io.Writer, io.Writer) error     { return errLinuxOnly }
func runDoctor(context.Context, []string, io.Writer, io.Writer) error  { return errLinuxOnly }
func runFlows(context.Context, []string, io.Writer, io.Writer) error   { return errLinuxOnly }
func runWeb(context.Context, []string, io.Writer, io.Writer) error     { return errLinuxOnly }
func runConnectivity(context.Context, []string, io.Writer, io.Writer) error {
	return errLinuxOnly
}
