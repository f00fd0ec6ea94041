package connectivity

// Do runs f on a thread in the network namespace to probe from; sockets
// opened inside f keep that namespace. A nil Do means the caller's own.
type Do func(func() error) error

// Run runs f in the namespace do enters.
func (do Do) Run(f func() error) error {
	if do == nil {
		return f()
	}
	return do(f)
}
