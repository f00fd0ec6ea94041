#!/usr/bin/env bash
# Runs Kubernetes' own e2e suite (e2e.test at KUBE_VERSION, built by
# test/kube/e2e-build.sh) against a running cluster, one or more selections:
#
#   conformance  every "[sig-network] ... [Conformance]" spec
#   netpol       the whole Netpol suite (k8s test/e2e/network/netpol)
#   ci           the focused subset CI runs on every submission: Services,
#                DNS, pod-to-pod across nodes, NetworkPolicy deny and allow
#   all          conformance and netpol
#
# Specs that need SCTP ([Feature:SCTPConnectivity]) are skipped by name when
# the kernel has no SCTP (no /proc/sys/net/sctp), and the reason is written
# into the report; nothing else is skipped. Specs run one at a time, in the
# order e2e.test gives, without retries.
#
# Usage:
#   test/cluster/e2e.sh [-o DIR] [-l LABEL] KUBECONFIG [SELECTION...] [-- E2E.TEST-FLAGS...]
#   test/cluster/e2e.sh --list SELECTION     the specs a selection runs (a dry run; no cluster)
#
# Each selection writes DIR/SELECTION/ (DIR defaults to
# /var/tmp/weft-e2e/<date>): e2e.test's JUnit report (junit_01.xml), Ginkgo's
# complete JSON report (ginkgo/report.json), the dry run's list of the
# selected specs (selected.json), the output (e2e.log) and meta.txt (key=value
# lines: label, versions, commit, times, exit status), which test/cluster/e2ereport turns
# into docs/conformance.md. Exit status: 0 when every selected spec passed.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=/dev/null
. "$repo/test/versions.env"
# shellcheck source=test/go.sh
. "$repo/test/go.sh"
KUBE_VERSION=v1.37.2 # keep in step with test/kube/build.sh
bin="$WEFT_CACHE/kube-$KUBE_VERSION"
log() { echo "e2e.sh: $*" >&2; }
usage() {
	sed -n '/^# Usage:/,/^#$/p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# focus SELECTION prints the selection's --ginkgo.focus regular expressions.
focus() {
	case "$1" in
	conformance) echo '\[sig-network\] .*\[Conformance\]' ;;
	netpol) echo '\[sig-network\] Netpol( |$)' ;;
	ci)
		local s='\[sig-network\] Services should '
		local d='\[sig-network\] DNS should provide DNS for '
		local g='\[sig-network\] Networking Granular Checks: Pods should function for '
		local n='\[sig-network\] Netpol NetworkPolicy between server and client should '
		printf '%s\n' \
			"${s}serve a basic endpoint from pods( |$)" \
			"${s}serve multiport endpoints from pods( |$)" \
			"${s}be able to create a functioning NodePort service( |$)" \
			"${d}the cluster \[Conformance\]" \
			"${d}services( |$)" \
			"${g}intra-pod communication: http( |$)" \
			"${g}intra-pod communication: udp( |$)" \
			"${g}node-pod communication: http( |$)" \
			"${n}support a 'default-deny-ingress' policy( |$)" \
			"${n}support a 'default-deny-all' policy( |$)" \
			"${n}support allow-all policy( |$)" \
			"${n}enforce policy to allow traffic from pods within server namespace based on PodSelector( |$)"
		;;
	*) log "unknown selection $1 (conformance, netpol, ci, all)"; exit 2 ;;
	esac
}

# The specs this machine cannot run, and why.
skip=""
skip_reason=""
if [ ! -d /proc/sys/net/sctp ]; then
	skip='\[Feature:SCTPConnectivity\]'
	skip_reason="SCTP: this kernel has no SCTP (no /proc/sys/net/sctp), so no pod can open an SCTP socket"
fi

# e2e_flags SELECTION prints e2e.test's selection flags, one a line.
e2e_flags() {
	local f
	while read -r f; do
		echo "--ginkgo.focus=$f"
	done < <(focus "$1")
	[ -z "$skip" ] || echo "--ginkgo.skip=$skip"
}

report_tool() {
	(cd "$repo" && go run ./test/cluster/e2ereport "$@")
}

need_e2e() {
	[ -x "$bin/e2e.test" ] || "$repo/test/kube/e2e-build.sh" >&2
}

# dry_run SELECTION DIR writes DIR/selected.json: the selection's specs
# (those skipped by name included), as e2e.test orders them.
dry_run() {
	local flags=() f
	while read -r f; do flags+=("--ginkgo.focus=$f"); done < <(focus "$1")
	mkdir -p "$2"
	"$bin/e2e.test" --ginkgo.dry-run --ginkgo.no-color "${flags[@]}" \
		--ginkgo.json-report="$2/selected.json" >"$2/dry-run.log" 2>&1 ||
		{ tail -20 "$2/dry-run.log" >&2; log "dry run of $1 failed"; return 1; }
}

if [ "${1:-}" = --list ]; then
	[ $# = 2 ] || usage
	need_e2e
	t="$(mktemp -d)"
	trap 'rm -rf "$t"' EXIT
	dry_run "$2" "$t"
	report_tool list "$t/selected.json"
	exit 0
fi

out="/var/tmp/weft-e2e/$(date -u +%Y%m%dT%H%M%SZ)"
label=""
while [ $# -gt 0 ]; do
	case "$1" in
	-o) out=$2; shift 2 ;;
	-l) label=$2; shift 2 ;;
	-h | --help) usage ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || usage
kubeconfig=$(realpath "$1")
shift
sels=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
	if [ "$1" = all ]; then sels+=(conformance netpol); else sels+=("$1"); fi
	shift
done
[ "${1:-}" != -- ] || shift
extra=("$@")
[ ${#sels[@]} -gt 0 ] || sels=(ci)
for s in "${sels[@]}"; do focus "$s" >/dev/null; done
[ -r "$kubeconfig" ] || { log "cannot read kubeconfig $kubeconfig"; exit 2; }
need_e2e
[ -x "$bin/kubectl" ] || { log "no $bin/kubectl: test/kube/build.sh builds it"; exit 1; }
commit="$(report_tool commit "$repo")"

status=0
for s in "${sels[@]}"; do
	d="$out/$s"
	rm -rf "$d"
	mkdir -p "$d"
	dry_run "$s" "$d"
	n="$(report_tool count -skip "$skip" "$d/selected.json")"
	log "$s: $n${skip:+ ($skip)}; reports in $d"
	mapfile -t flags < <(e2e_flags "$s")
	start=$(date +%s)
	rc=0
	# --ginkgo.timeout: the Netpol suite alone takes over an hour on 2 cores.
	"$bin/e2e.test" --kubeconfig="$kubeconfig" --kubectl-path="$bin/kubectl" --provider=skeleton \
		--report-dir="$d" --report-complete-ginkgo --disable-log-dump --ginkgo.no-color --ginkgo.v \
		--ginkgo.timeout=4h --e2e-output-dir="$d" "${flags[@]}" "${extra[@]}" >"$d/e2e.log" 2>&1 || rc=$?
	end=$(date +%s)
	{
		echo "label=$label"
		echo "selection=$s"
		echo "kube_version=$KUBE_VERSION"
		echo "commit=$commit"
		echo "cores=$(nproc)"
		echo "kernel=$(uname -r)"
		echo "started=$(date -u -d "@$start" +%Y-%m-%dT%H:%M:%SZ)"
		echo "seconds=$((end - start))"
		echo "exit=$rc"
		echo "skip=$skip"
		echo "skip_reason=$skip_reason"
		echo "e2e_flags=${flags[*]} ${extra[*]}"
	} >"$d/meta.txt"
	if [ -s "$d/ginkgo/report.json" ]; then
		report_tool summary "$d" >&2 || true
	else
		log "$s: e2e.test wrote no report (exit $rc); see $d/e2e.log"
		tail -20 "$d/e2e.log" >&2
	fi
	log "$s: exit $rc after $((end - start)) s"
	[ "$rc" = 0 ] || status=1
done
echo "$out"
exit "$status"
