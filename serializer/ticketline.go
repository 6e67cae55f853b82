package serializer

import "time"

// TicketLine is one session's cluster turn as an engine keeps it, with the
// rules of turn.go on plain values. An engine stores these fields and
// applies one method at a time, atomically (the Redis engine's scripts
// mirror these methods line for line); tests use it as the engine.
//
// The zero value is no line: the first Take starts one, numbering its
// tickets on from its start time in microseconds (ticketBase), so that a
// line started again after the engine lost it (a restart) never gives out
// a number a ticket of the old line still holds. Tickets are numbered in
// the order taken; Serving is the ticket whose turn it is, Next+1 when the
// turn is free. Until ends the served ticket's claim window (unclaimed) or
// lease.
type TicketLine struct {
	Next      int64
	Serving   int64
	Until     time.Time
	Withdrawn map[int64]bool // waiting tickets given up, skipped when reached
}

// Take queues a new ticket; its turn comes at once if the turn is free.
func (l *TicketLine) Take(now time.Time, lease, claim time.Duration) (int64, TicketState) {
	l.passOver(now, claim)
	if l.Serving == 0 {
		l.Next = ticketBase(now)
		l.Serving = l.Next + 1
	}
	l.Next++
	if l.Serving == l.Next {
		l.Until = now.Add(lease)
		return l.Next, TicketServed
	}
	return l.Next, TicketWaiting
}

// Claim says where ticket stands, and starts its lease if its turn came.
// A ticket the line does not know (the engine lost its state) counts as
// passed over, so that its holder takes a new one.
func (l *TicketLine) Claim(ticket int64, now time.Time, lease, claim time.Duration) TicketState {
	l.passOver(now, claim)
	switch {
	case ticket == l.Serving && ticket <= l.Next:
		l.Until = now.Add(lease)
		return TicketServed
	case ticket < l.Serving || ticket > l.Next:
		return TicketPassedOver
	}
	return TicketWaiting
}

// Renew extends the lease of ticket if it is served, and says so.
func (l *TicketLine) Renew(ticket int64, now time.Time, lease time.Duration) bool {
	if ticket != l.Serving || ticket > l.Next {
		return false
	}
	l.Until = now.Add(lease)
	return true
}

// Release hands the turn on if ticket is served, or withdraws it if it is
// still waiting. It reports whether a waiting ticket's turn came (whoever
// holds it should hear so).
func (l *TicketLine) Release(ticket int64, now time.Time, claim time.Duration) (handedOn bool) {
	switch {
	case ticket == l.Serving && ticket <= l.Next:
		l.advance(now, claim)
		return l.Serving <= l.Next
	case ticket > l.Serving && ticket <= l.Next:
		if l.Withdrawn == nil {
			l.Withdrawn = map[int64]bool{}
		}
		l.Withdrawn[ticket] = true
	}
	return false
}

// ticketBase is where a line started at now numbers its tickets from:
// microseconds since 1970, exact in the float64 numbers of Redis' Lua.
func ticketBase(now time.Time) int64 { return now.UnixMilli() * 1000 }

// passOver moves the turn past a served ticket whose lease, or claim
// window, has run out.
func (l *TicketLine) passOver(now time.Time, claim time.Duration) {
	for l.Serving != 0 && l.Serving <= l.Next && now.After(l.Until) {
		l.advance(now, claim)
	}
}

// advance gives the turn to the next ticket not withdrawn, which has
// claim to claim it.
func (l *TicketLine) advance(now time.Time, claim time.Duration) {
	l.Serving++
	for l.Withdrawn[l.Serving] {
		delete(l.Withdrawn, l.Serving)
		l.Serving++
	}
	l.Until = now.Add(claim)
}
