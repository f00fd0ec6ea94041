package alloc

import (
	"context"
	"testing"

	"github.com/weft-net/weft/vtep"
)

func TestAllocIsReadyAndEmpty(t *testing.T) {
	b := New()
	select {
	case <-b.Ready():
	default:
		t.Fatal("alloc not ready at once")
	}
	b.Set(vtep.Table{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- b.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.TxFrames+st.RxFrames != 0 || len(st.Repairs)+len(st.Drops)+len(st.Events) != 0 {
		t.Errorf("stats %+v", st)
	}
}
