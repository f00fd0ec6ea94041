#!/usr/bin/env bash
# Runs weft's fault suite (long variants) and writes docs/reliability.md:
# the fault rows from bench/faults, then every parser fuzzed for a fixed
# budget (FUZZTIME, default 60s each). Needs root and the tools of
# test/setup.sh, like test/run.sh; builds every host in network namespaces of
# its own. Takes about 35 minutes on 2 cores (the watch compaction row alone
# about 9, the firewalled-node row 4, the fuzzers 7).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
. test/versions.env
export WEFT_CNI_BIN="${WEFT_CNI_BIN:-$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION}"
export WEFT_FAULTS_LONG=1
report="$PWD/docs/reliability.md"
export WEFT_FAULTS_REPORT="$report"
fuzztime="${FUZZTIME:-60s}"
status=0
go test -count=1 -timeout 60m "$@" ./bench/faults/ || status=1

{
	echo
	echo "## Parsers fuzzed ($fuzztime each; seeds also run in every test run)"
	echo
	echo "| parser | fuzzer | executions | panics or round-trip violations | pass |"
	echo "|---|---|---|---|---|"
} >>"$report"
fuzz() { # parser package fuzzer
	local out execs pass=yes found=0
	if ! out=$(go test -run '^$' -fuzz "^$3\$" -fuzztime "$fuzztime" "./$2" 2>&1); then
		pass="**no**"
		found=1
		status=1
		echo "$out" | tail -20 >&2
	fi
	execs=$(grep -o 'execs: [0-9]*' <<<"$out" | tail -1 | cut -d' ' -f2)
	echo "| $1 | \`$2.$3\` | ${execs:-?} | $found | $pass |" >>"$report"
}
fuzz "lease key" subnet FuzzParseKey
fuzz "lease value" subnet FuzzLeaseValue
fuzz "network config" subnet FuzzParseConfig
fuzz "subnet file" subnet FuzzParseFile
fuzz "CNI config" plugin FuzzParseConfig
fuzz "VXLAN decoder" backend/uvxlan FuzzDecode
fuzz "TSO segmenter" backend/uvxlan FuzzSegment
exit $status
