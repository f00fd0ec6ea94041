// Command weft is weft's CNI plugin; see package plugin.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/weft-net/weft/plugin"
)

func main() {
	skel.PluginMainFuncs(plugin.Funcs(), plugin.Versions, plugin.About)
}
