#!/usr/bin/env bash
# Brings up a real multi-node Kubernetes cluster on this machine, with weft
# installed by kube-manifests/kube-weft.yml (or, with -cni flannel, Flannel
# by its own kube-flannel.yml), and prints the admin kubeconfig's path; the
# cluster runs until test/cluster/down.sh. Needs root. Arguments: -nodes N
# (default 3), -proxy-mode iptables|nftables, -cni weft|flannel, -backend
# TYPE (flannel: vxlan, host-gw, wireguard).
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
