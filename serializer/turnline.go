package serializer

import (
	"slices"
	"time"
)

// TurnLine is one session's cluster turn as an engine keeps it, with the
// rules of turn.go on plain values. An engine stores these fields and
// applies one method at a time, atomically (the Redis engine's script
// mirrors these methods line for line); tests use it as the engine.
//
// Callers name themselves by a token they make and never reuse (see
// turnTokens), so a call can be sent again after its answer was lost, and
// a line that an engine rolled back or lost never mistakes a new holder
// for an old one. Holder is the token whose turn it is, "" when the turn
// is free; Waiting holds the others in the order their requests arrived
// (on the engine's clock: the engine subtracts how long ago each arrived
// from its own time, so the instances' clocks need not agree). Until ends
// the holder's lease, or its claim window while it has not claimed a turn
// handed to it; it is zero only on a line the engine does not have.
type TurnLine struct {
	Holder  string
	Until   time.Time
	Waiting []TurnAsk
}

// TurnAsk is a token waiting in a TurnLine, and when its request arrived.
type TurnAsk struct {
	Token   string
	Arrived time.Time
}

// Take asks for the turn for token, whose request arrived at arrived: it
// is served at once if the turn is free, else it waits in line, behind the
// requests that arrived no later. Taking again with the same token (its
// first answer was lost) answers as Claim does and never queues it twice.
// first, for a token served, is when the first request waiting behind it
// arrived (zero: none waits).
func (l *TurnLine) Take(token string, arrived, now time.Time, lease, claim time.Duration) (state TurnState, first time.Time) {
	l.passOver(now, claim)
	if l.Holder == "" {
		l.Holder = token
	}
	if l.Holder == token {
		l.Until = now.Add(lease)
		return TurnServed, l.firstArrival()
	}
	if l.waiting(token) < 0 {
		i := len(l.Waiting)
		for i > 0 && l.Waiting[i-1].Arrived.After(arrived) {
			i--
		}
		l.Waiting = slices.Insert(l.Waiting, i, TurnAsk{token, arrived})
	}
	return TurnWaiting, time.Time{}
}

// Claim says where token stands, and starts its lease if its turn came;
// first as for Take. A token the line does not know (it was passed over,
// or the engine lost the line) is told so, and asks again.
func (l *TurnLine) Claim(token string, now time.Time, lease, claim time.Duration) (state TurnState, first time.Time) {
	l.passOver(now, claim)
	switch {
	case l.Holder == token:
		l.Until = now.Add(lease)
		return TurnServed, l.firstArrival()
	case l.waiting(token) >= 0:
		return TurnWaiting, time.Time{}
	}
	return TurnPassedOver, time.Time{}
}

// Renew extends the lease of token if it holds the turn, and says whether
// it does; first as for Take. A line the engine no longer has at all (a
// restart, the zero TurnLine) is taken up again by its holder, so that
// nobody else is served while its exchange runs.
func (l *TurnLine) Renew(token string, now time.Time, lease time.Duration) (held bool, first time.Time) {
	if l.Holder == "" && l.Until.IsZero() {
		l.Holder = token
	}
	if l.Holder != token {
		return false, time.Time{}
	}
	l.Until = now.Add(lease)
	return true, l.firstArrival()
}

// Release gives up token's turn, handing it to the first in line, or
// withdraws token from the line. It reports whether the turn was handed
// to a waiter (who should hear so).
func (l *TurnLine) Release(token string, now time.Time, claim time.Duration) (handedOn bool) {
	if l.Holder == token {
		l.advance(now, claim)
		return l.Holder != ""
	}
	if i := l.waiting(token); i >= 0 {
		l.Waiting = slices.Delete(l.Waiting, i, i+1)
	}
	return false
}

// waiting is token's place in line, or -1.
func (l *TurnLine) waiting(token string) int {
	return slices.IndexFunc(l.Waiting, func(a TurnAsk) bool { return a.Token == token })
}

// firstArrival is when the first request in line arrived; zero if none.
func (l *TurnLine) firstArrival() time.Time {
	if len(l.Waiting) == 0 {
		return time.Time{}
	}
	return l.Waiting[0].Arrived
}

// passOver moves the turn past a holder whose lease, or claim window, has
// run out.
func (l *TurnLine) passOver(now time.Time, claim time.Duration) {
	for l.Holder != "" && now.After(l.Until) {
		l.advance(now, claim)
	}
}

// advance hands the turn to the first in line, who has claim to claim
// it, or frees it.
func (l *TurnLine) advance(now time.Time, claim time.Duration) {
	l.Holder, l.Until = "", now
	if len(l.Waiting) > 0 {
		l.Holder, l.Waiting = l.Waiting[0].Token, l.Waiting[1:]
		l.Until = now.Add(claim)
	}
}
