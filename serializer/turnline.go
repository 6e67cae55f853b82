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
// is free; Waiting holds the others in the order they asked. Until ends
// the holder's lease, or its claim window while it has not claimed a turn
// handed to it; it is zero only on a line the engine does not have.
type TurnLine struct {
	Holder  string
	Until   time.Time
	Waiting []string
}

// Take asks for the turn for token: it is served at once if the turn is
// free, else it waits in line. wanted says that others wait behind a
// token served. Taking again with the same token (its
// first answer was lost) answers as Claim does and never queues it twice.
func (l *TurnLine) Take(token string, now time.Time, lease, claim time.Duration) (state TurnState, wanted bool) {
	l.passOver(now, claim)
	if l.Holder == "" {
		l.Holder = token
	}
	if l.Holder == token {
		l.Until = now.Add(lease)
		return TurnServed, len(l.Waiting) > 0
	}
	if !slices.Contains(l.Waiting, token) {
		l.Waiting = append(l.Waiting, token)
	}
	return TurnWaiting, false
}

// Claim says where token stands, and starts its lease if its turn came;
// wanted as for Take.
// A token the line does not know (it was passed over, or the engine lost
// the line) is told so, and asks again.
func (l *TurnLine) Claim(token string, now time.Time, lease, claim time.Duration) (state TurnState, wanted bool) {
	l.passOver(now, claim)
	switch {
	case l.Holder == token:
		l.Until = now.Add(lease)
		return TurnServed, len(l.Waiting) > 0
	case slices.Contains(l.Waiting, token):
		return TurnWaiting, false
	}
	return TurnPassedOver, false
}

// Renew extends the lease of token if it holds the turn, and says whether
// it does and whether others wait for it. A line the engine no longer has
// at all (a restart, the zero TurnLine) is taken up again by its holder,
// so that nobody else is served while its exchange runs.
func (l *TurnLine) Renew(token string, now time.Time, lease time.Duration) (held, wanted bool) {
	if l.Holder == "" && l.Until.IsZero() {
		l.Holder = token
	}
	if l.Holder != token {
		return false, false
	}
	l.Until = now.Add(lease)
	return true, len(l.Waiting) > 0
}

// Release gives up token's turn, handing it to the first in line, or
// withdraws token from the line. It reports whether the turn was handed
// to a waiter (who should hear so).
func (l *TurnLine) Release(token string, now time.Time, claim time.Duration) (handedOn bool) {
	if l.Holder == token {
		l.advance(now, claim)
		return l.Holder != ""
	}
	if i := slices.Index(l.Waiting, token); i >= 0 {
		l.Waiting = slices.Delete(l.Waiting, i, i+1)
	}
	return false
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
		l.Holder, l.Waiting = l.Waiting[0], l.Waiting[1:]
		l.Until = now.Add(claim)
	}
}
