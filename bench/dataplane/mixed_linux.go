package main

// mixedVXLAN builds one node with the kernel's VXLAN (as Flannel makes it)
// and the other with uvxlan in a process of its own, with or without the
// fast path: a node that weft moved to uvxlan (no VXLAN module) talking to
// a Flannel or weft vxlan node. The benchmark's traffic goes from node a to
// node b, so "kernel-to-fast" measures uvxlan receiving from the kernel and
// "fast-to-kernel" uvxlan sending to it.
func (t *topology) mixedVXLAN(mode string, queues int) error {
	kern, user := t.a, t.b
	if mode == "fast-to-kernel" || mode == "proc-to-kernel" {
		kern, user = t.b, t.a
	}
	if err := kernelNode(kern, user); err != nil {
		return err
	}
	fast := mode == "kernel-to-fast" || mode == "fast-to-kernel"
	np, err := startNode(user, kern, queues, fast)
	if err != nil {
		return err
	}
	t.addProc(np)
	return nil
}
