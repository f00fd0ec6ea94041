// Package web tests `weftctl web`'s page in a real browser: a three-node
// lab (one uvxlan node) built by internal/ops/lab, the page served by
// internal/ops/web, and Debian's headless Chromium driven through the
// DevTools protocol over a pipe (github.com/chromedp/chromedp). The browser
// runs in a network namespace of its own that holds only lo, where the page
// is served; it is checked to run there and to fail to reach the machine's
// loopback, and its process group is killed at the end. The checks are what a
// person sees: every node, pod and link; rates rising while a ping runs; a
// lease deleted in etcd gone from the page within 2 s; a rejected lease; a
// drift repair logged; a packet's path equal to `weftctl explain`'s;
// `weftctl web` run inside a node as on a real node (etcd flags, no --lab). With
// WEFT_WEB_SCREENSHOTS=1 it writes docs/web-1280.png and docs/web-phone.png.
// TestFlowsPanel checks the flows panel on one node namespace of its own
// whose policy table logs a drop that the browser must show, with the
// policy's name, and draw between the pods (docs/web-flows.png).
package web
