#!/usr/bin/env bash
# Takes down the cluster test/cluster/up.sh brought up: stops every process
# it started, removes its namespaces, cgroups and state, and restores the
# sysctls kubelet changed. Needs root.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=test/go.sh
. "$repo/test/go.sh"
cd "$repo"
exec go run ./test/cluster down
