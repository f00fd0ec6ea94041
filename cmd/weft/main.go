// Command weft is weft's CNI plugin; see package plugin. Run with the single
// argument plugin.ReapArg it is the background reaper that DEL starts.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/weft-net/weft/plugin"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == plugin.ReapArg {
		os.Exit(plugin.Reap())
	}
	skel.PluginMainFuncs(plugin.Funcs(plugin.SpawnReaper), plugin.Versions, plugin.About)
}
