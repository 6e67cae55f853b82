// Package stateengine is what the mcp_serializer handler and its state
// engines agree on: the Engine interface the engines (packages redisstate
// and storagestate) implement, the Abilities an engine declares beyond it,
// and the Adapter that makes an engine the session table's
// serializer.Store, with bounds, failure counts and batching that no
// engine has to write again.
package stateengine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Namespace is the Caddy module namespace of the state engines: an
// engine registers as Namespace + "." + its name.
const Namespace = "http.handlers.mcp_serializer.state"

// Engine is implemented by the modules of Namespace (redis, storage): an
// engine the handler shares session records through, so that several
// Caddy instances gate the same session.
//
// Every call goes through one Adapter that hashes the session id, bounds
// the call and counts failures, so an engine sees keys only: the hex
// SHA-256 of a session id, never the id. Writes carry ttl, the handler's
// session_ttl: a record lives that long after its last write, and an
// initializing record at least until its init deadline
// (serializer.RecordTTL). It comes with each call rather than at
// provision because the table, and so the ttl, is reconfigured in place
// on reload.
type Engine interface {
	// Abilities says what the engine can do beyond these calls.
	Abilities() Abilities
	// CallTimeout bounds each call; the adapter enforces it even on an
	// engine that does not honour its context.
	CallTimeout() time.Duration
	// Created writes a record: initializing, initialize exchange in
	// flight, gated until initDeadline.
	Created(ctx context.Context, key string, initDeadline time.Time, ttl time.Duration) error
	// InitializeEnded clears the in-flight mark. Updates never regress a
	// record (an open record stays open) and never recreate a missing one.
	InitializeEnded(ctx context.Context, key string, ttl time.Duration) error
	// Opened marks the record open.
	Opened(ctx context.Context, key string, ttl time.Duration) error
	// Touch refreshes the record's expiry.
	Touch(ctx context.Context, key string, ttl time.Duration) error
	// Forget removes the record.
	Forget(ctx context.Context, key string) error
	// Lookup reads the record; found is false when it is missing or
	// expired.
	Lookup(ctx context.Context, key string) (rec serializer.Record, found bool, err error)
}

// Retainer is an Engine whose connection a handler can keep open past the
// engine's own Cleanup: Caddy cleans a stopping config's modules up in no
// set order, and order owner still writes its handover then. release ends
// the hold; it may be called more than once.
type Retainer interface {
	Retain() (release func())
}

// Abilities is what an engine can do beyond one call per write and
// lookup. The zero value is an engine that can do nothing more.
type Abilities struct {
	// Batch, when set, sends several writes in one exchange with the
	// server (redis: one pipeline, one round trip), in their order,
	// setting each one's Err; it honours ctx. The adapter then gathers
	// the writes of concurrent calls into one batch, and takes a
	// session's later writes with nobody waiting for them.
	Batch func(ctx context.Context, ws []*Write, ttl time.Duration)
	// TakeOver, when set, records to as the owner of the record at key
	// if from still is (or none is), atomically, and returns the owner
	// recorded then: what `order owner` needs (package owner). found is
	// false when there is no record. Owners are recorded by Created
	// writes sent through Batch (Write.Owner).
	TakeOver func(ctx context.Context, key, from, to string) (owner string, found bool, err error)
	// ClaimOwner, when set, records me as the owner of the record at key
	// unless one is, creating the record if there is none, and returns the
	// owner recorded then; a record me owns lives ttl more. For queues
	// that have no record of their own (the key setting).
	ClaimOwner func(ctx context.Context, key, me string, ttl time.Duration) (owner string, err error)
	// MarkRunning, when set, records with the record at key that an
	// exchange of the instance named by (the owner string) me runs for
	// life more, or clears that mark when life is 0; it only marks an
	// existing record that me owns or last marked, so that an owner
	// taken over while its exchange runs can keep the mark fresh.
	// RunningFor reads how long the mark says an exchange still runs (0
	// for none). An instance taking a session over waits for the mark.
	MarkRunning func(ctx context.Context, key, me string, life time.Duration) error
	RunningFor  func(ctx context.Context, key string) (time.Duration, error)
	// RenewLease, DropLease and Members, when set, keep the instances'
	// leases (package owner's Leases): RenewLease keeps instance id's
	// lease, reached at addr, for life more on the engine's clock and
	// answers what it found (Renewal); DropLease ends it as lapsed that
	// long ago; Members lists the leases, those that lapsed within a day
	// included. Order owner needs them.
	RenewLease func(ctx context.Context, id, addr string, life time.Duration) (Renewal, error)
	DropLease  func(ctx context.Context, id string, lapsed time.Duration) error
	Members    func(ctx context.Context) (map[string]Lease, error)
}

// Renewal is what RenewLease found: the lease's epoch (1 for a new
// lease, one more each time it had lapsed), whether the engine had it at
// all, and the address it named before if it still stood.
type Renewal struct {
	Epoch   uint64
	Existed bool
	Holder  string
}

// Lease is an instance's lease as Members lists it.
type Lease struct {
	Addr string
	// Lapsed is how long ago the lease lapsed; 0 while it stands.
	Lapsed time.Duration
	// Dropped: its instance ended it (Drop), handing its sessions over.
	Dropped bool
}

// Op is one call to an engine, the value of the op label of
// caddy_mcp_serializer_state_errors_total.
type Op uint8

const (
	OpCreated Op = iota
	OpInitializeEnded
	OpOpened
	OpTouch
	OpForget
	OpLookup
	// Owners.
	OpTakeOver
	OpClaimOwner
	OpMarkRunning
	OpRunningFor
	OpRenewLease
	OpDropLease
	OpMembers
	NumOps
)

var opNames = [NumOps]string{"created", "initialize_ended", "opened", "touch", "forget", "lookup",
	"take_over", "claim_owner", "mark_running", "running_for",
	"renew_lease", "drop_lease", "members"}

func (o Op) String() string { return opNames[o] }

// Write is one write of a batch (Abilities.Batch).
type Write struct {
	Op       Op // OpCreated, OpInitializeEnded, OpOpened, OpTouch or OpForget
	Key      string
	Deadline time.Time // OpCreated's init deadline
	Owner    string    // OpCreated: the session's owner, "" for none
	Err      error     // the engine's answer

	// The adapter's, while the write waits for its batch.
	state   atomic.Uint32 // writeQueued, then writeSent or writeAbandoned
	done    chan struct{} // closed once the engine answered, or the write was left out; nil: nobody waits
	after   func()        // nil, or run at that moment
	id      string        // with no waiter: the session, for the failure's log line
	written func(error)   // with no waiter: given the engine's answer, for the table
}
