#!/usr/bin/env bash
# Brings up a real multi-node Kubernetes cluster on this machine, with weft
# installed by kube-manifests/kube-weft.yml (or, with -cni flannel, Flannel
# by its own kube-flannel.yml), and prints the admin kubeconfig's path; the
# cluster runs until test/cluster/down.sh. Needs root. Arguments:
#   -nodes N                      worker nodes (default 3)
#   -proxy-mode iptables|nftables kube-proxy's mode (default iptables)
#   -cni weft|flannel             the pod network (default weft)
#   -install manifest|helm        weft: kubectl apply -k of kube-weft.yml with
#                                 the image tag set (default), or helm install
#                                 of charts/weft with the image set by --set
#   -backend TYPE                 Backend.Type in net-conf.json: vxlan (the
#                                 default), uvxlan (weft), host-gw, wireguard
#   -fast-path true|false         weft's uvxlan Backend.FastPath (unset: on)
#   -network-policy true|false    false adds --network-policy=false to weftd's
#                                 args (unset: weft enforces NetworkPolicy)
#   -peer-filter true|false       false adds --vxlan-peer-filter=false to
#                                 weftd's args (unset: the vxlan backend admits
#                                 only peers at the VXLAN port; other backends
#                                 ignore the flag)
# Each setting is made as a user makes it: a kustomize patch of the
# manifest's net-conf.json ConfigMap or of weftd's args, or the chart's
# value by --set (flannel.backend, flannel.fastPath, flannel.args); nothing
# is copied into a node.
# State goes to $WEFT_CLUSTER_DIR (default /var/tmp/weft-cluster). The
# Kubernetes binaries are built first if missing (test/kube/build.sh).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=test/go.sh
. "$repo/test/go.sh"
# shellcheck source=/dev/null
. "$repo/test/versions.env"
export WEFT_CACHE
if [ -z "${WEFT_CNI_BIN:-}" ] && [ -x "$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION/loopback" ]; then
	export WEFT_CNI_BIN="$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION"
fi
"$repo/test/kube/build.sh" >&2
cd "$repo"
exec go run ./test/cluster up "$@"
