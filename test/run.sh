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
# shellcheck source=test/go.sh
. "$here/test/go.sh"
"$here/test/setup.sh"
# shellcheck source=/dev/null
. "$here/test/versions.env"
export WEFT_CNI_BIN="${WEFT_CNI_BIN:-$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION}"
export WEFT_FLANNELD="${WEFT_FLANNELD:-$WEFT_CACHE/flanneld-$FLANNEL_VERSION/flanneld}"

# Namespaces of an earlier run that was killed before its cleanups ran.
for ns in /run/netns/wefttest-*; do
	if [ -e "$ns" ]; then
		ip netns delete "$(basename "$ns")"
	fi
done

go vet ./...
# go test runs two packages at a time (-p, the number of cores) and starts
# them in the order they are named. test/e2e alone takes about 10 minutes,
# nearly half of the pass's test time: named first, it runs beside all the
# others; in ./...'s alphabetical order it started after most of them and
# ran its last 5 minutes alone. ./... lists it only once.
go test -count=1 -timeout 45m "$@" ./test/e2e ./...

# Every package again under the race detector, but those whose tests drive
# only programs of other builds: test/image (a docker build of the image),
# test/cluster (a real cluster running that image),
# test/runtimes (dockerd, podman, containerd around weft's binaries),
# test/e2e (weftd, weftctl and the plugin built as the image builds them,
# without the race detector, beside flanneld) and test/helm (the helm CLI);
# the code those binaries run is raced in its own packages' tests. The packet loops, the reconciler and
# Set run concurrently while traffic flows (uvxlan's TestPeerChurn, the
# repair tests), the registries and the daemon while leases change.
race=()
for p in $(go list ./...); do
	case "$p" in */test/image | */test/cluster | */test/runtimes | */test/e2e | */test/helm) continue ;; esac
	race+=("$p")
done
# Tests whose weft code all runs in weftd, weftctl and the plugin, built by
# nettest.Binary without the race detector, are skipped in this pass: under
# -race they would run the same binaries again. What they run in this
# process is raced by tests kept here: test/e2e's cluster, pings and
# streams by bench/faults' TestEtcdClientCertRequired (etcd over the
# underlay) and TestWeftdRestarts' fd store row (restarts under
# internal/fdstore's Keeper); the registries by TestWatchCompaction and
# TestRegistryStampede; the embedded etcd's kills and restarts by
# internal/etcdlocal's tests; kubetest by its own and subnet/kube's; the
# lab's state files by its unit tests. -skip applies to every package:
# test/deps' TestRaceSkips checks that each name is one test of the module,
# anchored. A -skip among this script's arguments replaces the list.
norace=(
	# bench/faults: faults injected around weftd.
	'^(TestEtcdCutOff|TestEtcdLeaderKills|TestEtcdOutage|TestHostileDatastore)$'
	'^TestWeftdRestarts$/^(vxlan|uvxlan)$'
	# cmd/weftctl: the weftctl binary against kube-apiserver.
	'^(TestLeasesKubernetes|TestDoctorKubernetes)$'
	# internal/ops/lab: weftctl lab up, doctor, peers, explain and
	# connectivity, run as binaries.
	'^(TestDoctorFaults|TestDoctorUVXLAN|TestDoctorFastPathFirewall|TestLabUpDown|TestLabUpAfterKill|TestMixedLabTCP)$'
)
skip=$(
	IFS='|'
	echo "${norace[*]}"
)
go test -race -count=1 -timeout 45m -skip "$skip" "$@" "${race[@]}"
