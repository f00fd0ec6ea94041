// Package policy benchmarks what weftd's NetworkPolicy enforcement costs
// the traffic of a pod: new-connection setup time (TCP connect to the
// first byte the server sends) and single-stream throughput (iperf3) from
// a client pod on one node to a server pod on another, with no policy
// selecting the server, with one policy that selects it and allows the
// client, with that policy among 1,000 others (selecting 1,000 other
// pods of the server's node), and with weftd's enforcement off. It runs a real kube-apiserver and two nodes
// running weftd with --network-policy, and plays the kubelet, as the
// NetworkPolicy tests in test/e2e do. Run it as root:
//
//	go test -run '^$' -bench . -benchtime 3x -timeout 60m ./bench/policy
//
// It prints the figures and asserts none of them; WEFT_BENCH_REPORT names
// the markdown file (bench/policy/README.md) whose report sections the run
// rewrites. README.md says what is measured and how.
package policy
