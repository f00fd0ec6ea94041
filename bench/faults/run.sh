#!/usr/bin/env bash
# Runs weft's fault suite (long variants) and writes docs/reliability.md.
# Needs root and the tools of test/setup.sh, like test/run.sh; builds every
# host in network namespaces of its own. Takes about ten minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
. test/versions.env
export WEFT_CNI_BIN="${WEFT_CNI_BIN:-$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION}"
export WEFT_FAULTS_LONG=1
export WEFT_FAULTS_REPORT="$PWD/docs/reliability.md"
go test -count=1 -timeout 60m "$@" ./bench/faults/
