// Package cluster benchmarks pod networking on the real multi-node cluster
// of test/cluster the way published CNI comparisons do: iperf3 from a pod
// on one node to a pod on another and to a ClusterIP Service in front of
// it (TCP one stream, TCP 8 streams, UDP at full rate), request/response
// latency and a new-connection rate (rr, beside this file), the CPU both
// nodes' cgroups use during each test, and the CNI's own DaemonSet pod's
// CPU and memory at rest. Each column is a cluster already brought up by
// test/cluster/up.sh (WEFT_BENCH_CLUSTERS names their state directories),
// plus the bare underlay between the first cluster's node namespaces, the
// limit. Rounds are interleaved between the columns. Run it as root:
//
//	WEFT_BENCH_CLUSTERS=weft-vxlan=/var/tmp/weft-bc-a,weft-uvxlan=/var/tmp/weft-bc-b \
//		go test -run '^$' -bench Cluster -benchtime 3x -timeout 60m ./bench/cluster
//
// It prints the figures and asserts none of them; WEFT_BENCH_REPORT names
// the markdown file (bench/cluster/README.md) whose report section the run
// rewrites. README.md says what is measured and how.
package cluster
