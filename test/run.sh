#!/usr/bin/env bash
# Runs every weft test. Needs root (tests build hosts in network namespaces
# of their own and never touch the root namespace) and the tools that
# test/setup.sh installs. Extra arguments go to `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)

if [ "$(id -u)" != 0 ]; then
	echo "test/run.sh: the tests need root (network namespaces); run it with sudo" >&2
	exit 1
fi
"$here/test/setup.sh"
# shellcheck source=/dev/null
. "$here/test/versions.env"
export WEFT_CNI_BIN="${WEFT_CNI_BIN:-$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION}"

# Namespaces of an earlier run that was killed before its cleanups ran.
for ns in /run/netns/wefttest-*; do
	if [ -e "$ns" ]; then
		ip netns delete "$(basename "$ns")"
	fi
done

go vet ./...
go test -count=1 -timeout 45m "$@" ./...

# The race detector over every package whose tests need no root (no network
# namespaces) and no kube-apiserver: the control plane (registries, daemon,
# peer table) where the concurrency is. Measured 2026-11-30: ~40 s of tests;
# the -race build of etcd's server adds minutes when the cache is cold.
race=()
for p in $(go list ./...); do
	case "$p" in */backend | */backend/*) continue ;; esac # all of them below
	deps=$(go list -test -deps "$p")
	if ! grep -qE 'weft/internal/(nettest|kubetest)$' <<<"$deps"; then
		race+=("$p")
	fi
done
go test -race -count=1 -timeout 20m "$@" "${race[@]}"

# The dataplanes under the race detector too (they need root and network
# namespaces): the packet loops, the reconciler and Set run concurrently
# while traffic flows (uvxlan's TestPeerChurn, the repair tests).
go test -race -count=1 -timeout 20m "$@" ./backend/...
