package serializer

import (
	"errors"
	"testing"
)

// The synthesize action's notifications/initialized is not needed once
// the client's own was acknowledged while it waited for its turn:
// AcquireSynthesized then releases the turn and says so.
func TestSynthesizedInitializedIsSkippedOnceTheClientsWasAcknowledged(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	clients := mustGet(t, acquireAsync(t, tab, bg, "s", CarriesInitialized))
	synthesized := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireSynthesized(bg, "s", Line{})
		synthesized <- result{turn, err}
	}()
	eventually(t, func() bool { return waitingCount(tab, "s") == 1 })
	clients.turn.Done(202)
	if r := mustGet(t, synthesized); !errors.Is(r.err, ErrAlreadyInitialized) {
		t.Fatalf("synthesized initialized after the client's was acknowledged: err = %v, want ErrAlreadyInitialized", r.err)
	}
	// The turn was released: the session's next request goes at once.
	next, err := tab.Acquire(bg, "s", 0)
	if err != nil {
		t.Fatal(err)
	}
	next.Done(200)
}

func TestSynthesizedInitializedGoesWhileTheGateIsClosed(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	held := acquireAsync(t, tab, bg, "s", 0)
	turn, err := tab.AcquireSynthesized(bg, "s", Line{})
	if err != nil {
		t.Fatalf("synthesized initialized at a closed gate: %v", err)
	}
	mustWait(t, held)
	turn.Done(202)
	mustGet(t, held).turn.Done(200)
}
