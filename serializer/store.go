package serializer

import (
	"context"
	"time"
)

// Store is session state shared between instances, so that a session
// created behind one instance is gated on the instance that gets its
// follow-ups. A table without one (Config.Store nil) keeps everything
// local, at no cost.
//
// A session id is a credential: implementations must key records by a
// hash of it, never by the id. Each call must return within the
// implementation's own bound and honour its context's deadline (the table
// sets one of Config.StoreTimeout); an error means "unknown", and the
// table falls back to its local behaviour.
//
// The table calls Created synchronously, before the new session's id
// reaches its client, and makes a session's later writes (InitializeEnded,
// Opened, Forget) one at a time, in that order, without holding any
// request back (writes.go); through the WriteQueue if there is one
// (Config.Writes). Writes other than Created never recreate a missing
// record, and never turn an open record back into an initializing one: an
// instance's writes may arrive after another instance's.
type Store interface {
	// Created records a session this instance has just created: still
	// initializing, with its initialize exchange in flight, gated until
	// initDeadline.
	Created(ctx context.Context, id string, initDeadline time.Time) error
	// InitializeEnded records that the initialize exchange's response
	// has ended, so follow-ups elsewhere may go once the gate allows.
	InitializeEnded(ctx context.Context, id string) error
	// Opened records that the session's notifications/initialized was
	// acknowledged: the gate is open everywhere.
	Opened(ctx context.Context, id string) error
	// Touch extends the life of a live session's record. The table calls
	// it at most a few times per SessionTTL per session, never per request.
	Touch(ctx context.Context, id string) error
	// Forget removes the session's record (it ended, or the upstream no
	// longer knows it).
	Forget(ctx context.Context, id string) error
	// Lookup returns the session's record; found is false when there is
	// none (never created behind a store, ended, or expired).
	Lookup(ctx context.Context, id string) (rec Record, found bool, err error)
}

// OwnerStore is a Store that also records which instance owns a session
// it creates (package owner).
type OwnerStore interface {
	Store
	// CreatedOwned is Created, recording owner with the record.
	CreatedOwned(ctx context.Context, id string, initDeadline time.Time, owner string) error
}

// Record is what a Store knows of a session.
type Record struct {
	Open bool // notifications/initialized was acknowledged
	// While not Open: when the gate's init_timeout runs out, and whether
	// the initialize exchange's response is still being sent.
	InitDeadline       time.Time
	InitializeInFlight bool
	// The instance that serves the session, as package owner records it;
	// "" if none was recorded.
	Owner string
}

// SynthSource is the request behind an Acquire, as the caller knows it.
// The table asks it for the function the Synthesize action calls only for
// a session it has just adopted gated from the Store (a session created
// here gets that function from Begin), and only while the request is
// still waiting for its turn, so the request may be read without a lock.
type SynthSource interface {
	// Synthesizer returns a function that sends notifications/initialized
	// upstream for session id through Table.Acquire and reports its
	// success, or nil if it cannot.
	Synthesizer(id string) func(context.Context) bool
}
