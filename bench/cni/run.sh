#!/usr/bin/env bash
# Benchmarks weft's CNI plugin against bridge+host-local (ADD+DEL cycles per
# second, same run, test namespaces only). Needs root. Extra arguments go to
# `go test`, e.g. -benchtime=500x.
set -euo pipefail
cd "$(dirname "$0")/../.."
test/setup.sh
# shellcheck source=/dev/null
. test/versions.env
export WEFT_CNI_BIN="${WEFT_CNI_BIN:-$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION}"
go test -run '^$' -bench AddDel -benchtime=200x -count=1 "$@" ./bench/cni
