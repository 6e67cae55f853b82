package serializer

import "testing"

// Gated tells the synthesize action whether its notifications/initialized
// is still needed once its turn comes: not when the client's own was
// acknowledged while it waited.
func TestTurnGatedTellsWhetherInitializedWasAcknowledged(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	if !initialize.Gated() {
		t.Fatal("a new session's turn is not gated")
	}
	initialize.Done(200)
	clients := mustGet(t, acquireAsync(t, tab, bg, "s", CarriesInitialized))
	synthesized := acquireAsync(t, tab, bg, "s", CarriesInitialized)
	if !clients.turn.Gated() {
		t.Fatal("gate open before initialized was answered")
	}
	clients.turn.Done(202)
	if r := mustGet(t, synthesized); r.turn.Gated() {
		t.Fatal("gate still closed after initialized was acknowledged")
	} else {
		r.turn.Done(0)
	}
	if (Turn{}).Gated() {
		t.Fatal("the zero Turn is gated")
	}
	unknown, _ := tab.Acquire(bg, "unknown", 0)
	defer unknown.Done(200)
	if unknown.Gated() {
		t.Fatal("an unknown session's turn is gated")
	}
}
