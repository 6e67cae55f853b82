// Package caddymodule registers mcp_serializer, the Caddy HTTP handler that
// runs each MCP session's requests one at a time in arrival order and holds
// a new session's messages until the upstream has acknowledged
// notifications/initialized. The scheduling lives in package serializer.
package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Get-stream modes.
const (
	getStreamForward = "forward"
	getStreamReject  = "reject"
)

const defaultMaxBody = 1 << 20

// Order settings: a session's requests in order on each instance (behind
// a front that keeps a session on one), or across instances (any front).
const (
	orderLocal   = "local"
	orderCluster = "cluster"
	orderOwner   = "owner"
)

// upstream_sessions settings: where the upstream keeps its sessions.
const (
	upstreamSessionsShared   = "shared"
	upstreamSessionsInstance = "instance"
)

// Handler is the mcp_serializer HTTP handler. Handlers with the same Name
// share one session table, which survives config reloads.
type Handler struct {
	// Name of the session table. Handlers with the same name share
	// sessions and must agree on the table's settings; handlers with
	// different names keep independent sessions. Default: one shared table.
	Name string `json:"name,omitempty"`
	// How long a new session's messages are held waiting for the upstream
	// to acknowledge notifications/initialized. Default: 10s.
	InitTimeout caddy.Duration `json:"init_timeout,omitempty"`
	// What happens to held messages at init_timeout: forward, synthesize
	// or reject. Default: forward.
	OnInitTimeout string `json:"on_init_timeout,omitempty"`
	// Longest wait for a request's turn, in the queue or at the gate,
	// before it is answered 503. Default: 30s.
	QueueTimeout caddy.Duration `json:"queue_timeout,omitempty"`
	// Requests waiting per session before new ones get 429. Default: 32.
	MaxQueue int `json:"max_queue,omitempty"`
	// Sessions tracked before idle ones are evicted. Default: 100000.
	MaxSessions int `json:"max_sessions,omitempty"`
	// Idle time after which a session is forgotten. Default: 1h.
	SessionTTL caddy.Duration `json:"session_ttl,omitempty"`
	// Bytes of a POST body read to classify it; larger bodies are
	// streamed through as ordinary messages. Default: 1 MiB.
	MaxBody int64 `json:"max_body,omitempty"`
	// Bytes of request bodies this handler holds at once, over every POST
	// in a session waiting for its turn or being served: each body is held
	// until its request ends. A POST that does not fit is answered 503 with
	// Retry-After: 1, its body unread. A body counts for its Content-Length,
	// or for max_body+1 bytes until its end shows its size. Default: 64 MiB
	// (max_body+1 if that is more); it must be more than max_body.
	MaxBuffered int64 `json:"max_buffered,omitempty"`
	// What to do with the server-to-client GET stream: reject with 405, or
	// forward it (after the gate opens) to a backend whose GET stream does
	// not write session state. Default: reject.
	GetStream string `json:"get_stream,omitempty"`
	// Shared session state, so that several Caddy instances gate the same
	// session: an engine of the http.handlers.mcp_serializer.state
	// namespace (redis, storage). Default: none; sessions are known to
	// this instance only.
	StateRaw json.RawMessage `json:"state,omitempty" caddy:"namespace=http.handlers.mcp_serializer.state inline_key=module"`
	// Where a session's order is kept: owner (every request of a session
	// is served by the instance that created it, the others forward it
	// there: any front, round robin included; needs state redis) or local
	// (on each instance: one instance, or a front that sends all of a
	// session's requests to one). cluster runs as owner. Default: owner
	// with state redis, else local.
	Order string `json:"order,omitempty"`
	// With order owner: host:port where the other instances reach this
	// one, recorded as the owner of the sessions it creates; placeholders
	// such as {env.POD_IP} are read at load. Default: the address at
	// which each session's initialize reached this instance.
	Advertise string `json:"advertise,omitempty"`
	// With order owner: where the upstream keeps its sessions. shared (a
	// store every instance's upstream reads: PHP-FPM with a database or
	// Redis) lets another instance take a session over when its owner
	// stops or dies; instance (the instance's own upstream keeps them in
	// memory, one replica per instance) keeps each session with the
	// instance that created it, across that instance's restart, and
	// answers 404 once the instance is gone for good. Default: shared.
	UpstreamSessions string `json:"upstream_sessions,omitempty"`
	// With upstream_sessions instance: a name this instance keeps across
	// its restarts, such as {env.HOSTNAME} (a pod's name), unique among
	// the instances; placeholders are read at load. Default: advertise.
	InstanceName string `json:"instance_name,omitempty"`
	// Queues requests by this placeholder's value, e.g.
	// {http.request.header.Authorization} or, for MCP 2026-07-28 handles,
	// {http.request.header.Mcp-Param-Cart}: requests whose key is not empty
	// run one at a time per value, in arrival order, initialize and every
	// session they start included; a session's requests also keep their
	// session's order and gate. Default: none.
	Key string `json:"key,omitempty"`
	// The secret key values are hashed with; placeholders such as
	// {env.MCP_SERIALIZER_KEY_SECRET} are read at load. Default: a secret
	// of this process's own, or with shared state none (a plain hash).
	KeySecret string `json:"key_secret,omitempty"`
	// With key basic_user: the route of the MCP server's site that proves
	// a credential before its requests join their user's line, answering
	// 2xx to a right one and 401 to a wrong one; it gets a GET with
	// the request's Authorization header and no cookie. Default:
	// /wp-json/wp/v2/users/me?context=edit (WordPress, which names the
	// user's login there: a client signing in by e-mail joins its line).
	KeyProof string `json:"key_proof,omitempty"`

	keySecret []byte      // what key values are hashed with; nil: a plain hash
	keyProof  *url.URL    // key_proof, read
	proofs    *proofs     // with key basic_user: the credentials the MCP server accepted or refused
	budget    *bodyBudget // max_buffered and what is held of it
	// keySecrets, with key and order owner, tells whether the instances
	// hash key values alike.
	keySecrets *keySecretCheck
	// With order owner: who owns which session, the engine that records
	// it, and the proxy to the owners; nil otherwise.
	owners     *owner.Directory
	ownerStore ownerStore
	// releaseEngine ends the hold on the state engine's connection that
	// the handover needs; nil without one.
	releaseEngine func()
	ownerConfigs  *atomic.Int32 // the table's (pooledTable.ownerConfigs)
	forwarder     *reverseproxy.Handler
	forwardLines  *forwardLines // the table's
	// formerOwner, without order owner but with an engine that records
	// owners, is the table's instance ID, which forwards sent before a
	// reload turned order owner off still name.
	formerOwner   string
	advertise     string
	instanceName  string             // with upstream_sessions instance, read
	engine        stateengine.Engine // nil without state
	onInitTimeout serializer.TimeoutAction
	table         *serializer.Table
	poolKey       string
	// This config's table settings and when it was provisioned; they reach
	// the shared table with the first request the config serves.
	settings   serializer.Config
	generation uint64
	applied    *appliedSettings
	logger     *zap.Logger
	// synthWarns spaces the WARNs of on_init_timeout synthesize, each kind
	// on its own: every client that walks away after initialize causes one.
	synthWarns *synthWarnings
	claim      tableUse    // set on the config's first handler of a table
	claimed    *tableClaim // to check the others against
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mcp_serializer",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision fills in defaults, loads the state engine, checks the
// settings (Validate) and attaches the handler to its session table,
// creating it if no loaded config has it. A table already in use keeps
// its settings until this config serves a request (applySettings): Caddy
// provisions a config before it decides to run it, and a config it
// refuses must change nothing that runs.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.synthWarns = new(synthWarnings)
	h.fillDefaults()
	rawState := h.StateRaw // LoadModule clears it
	if h.StateRaw != nil {
		mod, err := ctx.LoadModule(h, "StateRaw")
		if err != nil {
			return fmt.Errorf("state: %w", err)
		}
		engine, ok := mod.(stateengine.Engine)
		if !ok {
			return fmt.Errorf("state: %T is not a mcp_serializer state engine", mod)
		}
		h.engine = engine
	}
	h.defaultOrder()
	// Checked before the handler touches a shared table, so that a refused
	// config creates or changes none; Caddy runs Validate again after.
	if err := h.Validate(); err != nil {
		return err
	}
	if err := h.provisionKey(); err != nil {
		return err
	}
	cfg, _ := h.tableConfig()
	if err := h.claimTable(ctx, cfg, rawState); err != nil {
		return err
	}
	h.onInitTimeout = cfg.OnInitTimeout
	h.budget = &bodyBudget{limit: h.MaxBuffered}
	watchConns(ctx)
	registerMetrics(ctx.GetMetricsRegistry())
	cfg.Events = newEvents(h.logger)
	if h.engine != nil {
		shared := stateengine.NewAdapter(h.engine, cfg.SessionTTL, h.logger, metrics.stateErrors)
		shared.Configure(&cfg)
		if h.Order == orderOwner {
			cfg.GateReadAfter = ownerGateReadAfter
			h.ownerStore = shared
			forwarder, err := newForwarder(ctx)
			if err != nil {
				return err
			}
			h.forwarder = forwarder
		}
	}

	h.settings, h.generation = cfg, provisions.Add(1)
	h.poolKey = poolKeyPrefix + h.Name
	val, _, err := tables.LoadOrNew(h.poolKey, func() (caddy.Destructor, error) {
		// A new table starts with these settings: no running config uses it.
		applied := &appliedSettings{}
		applied.generation.Store(h.generation)
		members := owner.NewMembership(h.instanceID(), applied.leases, nil)
		owners := owner.NewDirectory(members, cfg.MaxSessions, cfg.SessionTTL, nil)
		tableCfg := cfg
		tableCfg.Clock = newTableClock()
		return pooledTable{serializer.NewTable(tableCfg), applied, owners, newProofs(cfg.MaxSessions), new(atomic.Int32), new(forwardLines)}, nil
	})
	if err != nil {
		return err
	}
	pooled := val.(pooledTable)
	h.table, h.applied, h.proofs, h.ownerConfigs, h.forwardLines = pooled.Table, pooled.applied, pooled.proofs, pooled.ownerConfigs, pooled.forwardLines
	h.applied.provisioned(h.generation, cfg)
	if h.Order != orderOwner && h.engineRecordsOwners() {
		h.formerOwner = pooled.owners.Self()
	}
	if h.Order == orderOwner {
		h.owners = pooled.owners
		h.ownerConfigs.Add(1)
		h.owners.SetTTL(cfg.SessionTTL)
		h.owners.SetPinned(h.pinned())
		if h.pinned() {
			// Known at once, so that an instance started again renews its
			// lease before any request reaches it.
			h.owners.Members().SetAddr(h.advertise)
		}
		if h.pinned() && h.owners.Self() != h.instanceID() {
			h.logger.Warn("upstream_sessions instance: this instance keeps the ID it started with until it restarts; "+
				"sessions it creates meanwhile are lost at that restart",
				zap.String("instance_name", h.instanceName))
		}
		owners, store, logger, name := h.owners, h.ownerStore, h.logger, h.instanceName
		owners.Members().OnShared(func(addr string) {
			if ok, suppressed := sharedIDWarns.Allow(time.Now()); ok {
				logger.Error("order owner: another instance renews this instance's lease: both run under one ID, and each takes "+
					"the other's sessions for its own; give each instance its own instance_name",
					zap.String("instance_name", name), zap.String("other", addr), zap.Int("suppressed", suppressed))
			}
		})
		owners.Members().OnForgotten(func() {
			ctx, cancel := context.WithTimeout(context.Background(), handOverTimeout)
			go func() {
				defer cancel()
				owners.ReclaimKeys(ctx, store)
			}()
		})
		h.owners.Members().Start()
		if h.Key != "" {
			h.keySecrets = startKeySecretCheck(h.Name, h.keySecret, h.ownerStore, h.logger)
		}
		if r, ok := h.engine.(stateengine.Retainer); ok {
			// Open for the handover, whenever Caddy cleans the engine up.
			h.releaseEngine = r.Retain()
		}
	}
	return nil
}

// handOver runs when this handler's config stops, after Caddy's servers
// have finished the requests they had, if no other config uses the
// session table (Caddy stops, or a reload drops this handler): this
// instance drops its lease and hands its sessions over, so that the next
// instance serves them at once and nothing it ran overlaps.
func (h *Handler) handOver() {
	ctx, cancel := context.WithTimeout(context.Background(), handOverTimeout)
	defer cancel()
	if h.pinned() {
		// Only this instance's upstream holds its sessions: the others
		// wait for it to start again, and give them up only once its
		// lease has lapsed for good.
		h.owners.Members().StopKeeping(ctx, h.ownerStore, restartLease)
		h.logger.Info("order owner: this instance's sessions wait for it to start again (upstream_sessions instance)",
			zap.Duration("lease_kept", restartLease))
		return
	}
	h.owners.Members().Stop(ctx, h.ownerStore)
	released := h.owners.Release(ctx, h.ownerStore)
	h.logger.Info("order owner: handed this instance's sessions over", zap.Int("sessions", released))
}

// handOverTimeout bounds a stopping instance's handover; a session it
// could not hand over is taken over once the instance's lease lapses.
const handOverTimeout = 5 * time.Second

// restartLease is how long a stopping instance with upstream_sessions
// instance keeps its lease, for it to start again: a Caddy restart or
// upgrade takes a few seconds.
const restartLease = 15 * time.Second

// defaultOrder fills in order: owner where the state engine can record
// owners (safe behind any front, and free behind one that keeps a session
// on one instance), else local. order cluster, an earlier way of ordering
// across instances, runs as owner: configs written for it keep loading,
// with a WARN.
func (h *Handler) defaultOrder() {
	canOwn := h.engineRecordsOwners()
	switch {
	case h.Order == orderCluster && canOwn:
		h.logger.Warn("order cluster is replaced by order owner and runs as it: each session's requests are forwarded to the instance that created it; " +
			"write `order owner`, or leave order out (owner is the default with state redis)")
		h.Order = orderOwner
	case h.Order != "":
	case canOwn:
		h.Order = orderOwner
	default:
		h.Order = orderLocal
	}
}

// engineRecordsOwners reports whether the state engine can record and
// take over session owners, as order owner needs.
func (h *Handler) engineRecordsOwners() bool {
	if h.engine == nil {
		return false
	}
	a := h.engine.Abilities()
	return a.TakeOver != nil && a.ClaimOwner != nil && a.RenewLease != nil && a.Members != nil
}

// provisions numbers handler provisions: a later config's settings
// replace an earlier one's, never the reverse.
var provisions atomic.Uint64

// appliedSettings is which config's settings a table runs with.
type appliedSettings struct {
	mu         sync.Mutex // one Configure at a time
	generation atomic.Uint64
	// The settings of the table's handlers provisioned and not yet
	// cleaned up, by generation. Guarded by mu.
	live map[uint64]serializer.Config
}

func (a *appliedSettings) provisioned(generation uint64, cfg serializer.Config) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.live == nil {
		a.live = map[uint64]serializer.Config{}
	}
	a.live[generation] = cfg
}

// leases is the state engine of the newest config, for the instance's
// lease: nil while none is live.
func (a *appliedSettings) leases() owner.Leases {
	a.mu.Lock()
	defer a.mu.Unlock()
	newest := uint64(0)
	for g := range a.live {
		newest = max(newest, g)
	}
	l, _ := a.live[newest].Store.(owner.Leases)
	return l
}

// runningStore is the state engine of the config the table runs with now,
// for the running marks of an exchange that began under an older config:
// a reload may have closed that config's client since.
func (a *appliedSettings) runningStore() owner.RunningStore {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, _ := a.live[a.generation.Load()].Store.(owner.RunningStore)
	return s
}

// cleanedUp forgets a handler's settings. If the table runs with them,
// the config being stopped was the running one, and Caddy stops it only
// once its successor runs: the newest settings still live go to the
// table now, so that its background work (record refreshes, lookups at
// init_timeout, reads of a held gate's record) stops using an engine that
// is closing, even if the new config has not served a request yet.
func (a *appliedSettings) cleanedUp(table *serializer.Table, generation uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.live, generation)
	if a.generation.Load() != generation {
		return
	}
	newest := uint64(0)
	for g := range a.live {
		newest = max(newest, g)
	}
	if newest > generation {
		table.Configure(a.live[newest])
		a.generation.Store(newest)
	}
}

// applySettings gives the table this handler's settings if they are newer
// than those it runs with. Only a config Caddy runs serves requests, so a
// refused one never gets here; a config being replaced, still finishing
// requests, does not undo its successor's settings. One atomic load when
// nothing changed.
func (h *Handler) applySettings() {
	if h.applied.generation.Load() >= h.generation {
		return
	}
	h.applied.mu.Lock()
	defer h.applied.mu.Unlock()
	if h.applied.generation.Load() < h.generation {
		h.table.Configure(h.settings)
		h.applied.generation.Store(h.generation)
	}
}

// fillDefaults sets the handler's own settings left out.
func (h *Handler) fillDefaults() {
	if h.MaxBody == 0 {
		h.MaxBody = defaultMaxBody
	}
	if h.MaxBuffered == 0 {
		h.MaxBuffered = max(defaultMaxBuffered, h.MaxBody+1)
	}
	if h.GetStream == "" {
		h.GetStream = getStreamReject
	}
}

// tableConfig is the session table's settings, defaults filled in.
func (h *Handler) tableConfig() (serializer.Config, error) {
	cfg := serializer.Defaults()
	if h.InitTimeout != 0 {
		cfg.InitTimeout = time.Duration(h.InitTimeout)
	}
	if h.OnInitTimeout != "" {
		a, err := serializer.ParseTimeoutAction(h.OnInitTimeout)
		if err != nil {
			return cfg, fmt.Errorf("on_init_timeout: %w", err)
		}
		cfg.OnInitTimeout = a
	}
	if h.QueueTimeout != 0 {
		cfg.QueueTimeout = time.Duration(h.QueueTimeout)
	}
	if h.MaxQueue != 0 {
		cfg.MaxQueue = h.MaxQueue
	}
	if h.MaxSessions != 0 {
		cfg.MaxSessions = h.MaxSessions
	}
	if h.SessionTTL != 0 {
		cfg.SessionTTL = time.Duration(h.SessionTTL)
	}
	return cfg, nil
}

// Validate checks every setting, naming it on error. Provision runs it
// once the defaults and the state engine are in.
func (h *Handler) Validate() error {
	cfg, err := h.tableConfig()
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	switch {
	case h.MaxBody < 0:
		return fmt.Errorf("max_body must be positive, got %d", h.MaxBody)
	case h.MaxBuffered <= h.MaxBody:
		return fmt.Errorf("max_buffered must be more than max_body (%d bytes), got %d: a body of unknown length counts for max_body+1 bytes",
			h.MaxBody, h.MaxBuffered)
	}
	switch h.GetStream {
	case getStreamForward, getStreamReject:
	default:
		return fmt.Errorf("get_stream: unknown mode %q (want forward or reject)", h.GetStream)
	}
	if h.KeySecret != "" && h.Key == "" {
		return fmt.Errorf("key_secret is for key only, which is not set")
	}
	if h.KeyProof != "" && h.Key != keyBasicUser {
		return fmt.Errorf("key_proof is for key basic_user only")
	}
	if h.Advertise != "" && h.Order != orderOwner {
		return fmt.Errorf("advertise is for order owner only (order is %s)", h.Order)
	}
	if err := h.validateUpstreamSessions(); err != nil {
		return err
	}
	switch h.Order {
	case orderLocal:
	case orderOwner, orderCluster:
		return h.validateOwnerOrder()
	default:
		return fmt.Errorf("order: unknown value %q (want owner or local)", h.Order)
	}
	return nil
}

// validateUpstreamSessions checks upstream_sessions and reads
// instance_name.
func (h *Handler) validateUpstreamSessions() error {
	switch h.UpstreamSessions {
	case "", upstreamSessionsShared:
		if h.InstanceName != "" {
			return fmt.Errorf("instance_name is for upstream_sessions instance only")
		}
		return nil
	case upstreamSessionsInstance:
	default:
		return fmt.Errorf("upstream_sessions: unknown value %q (want shared or instance)", h.UpstreamSessions)
	}
	if h.Order != orderOwner && h.Order != orderCluster {
		return fmt.Errorf("upstream_sessions instance needs order owner (order is %s): a session must reach the instance whose upstream holds it", h.Order)
	}
	if h.Advertise == "" {
		// Without it an instance started again could not renew its lease
		// before a request told it its address, and over TLS its sessions
		// would record none.
		return fmt.Errorf("upstream_sessions instance needs advertise: the host:port where the other instances reach this one, such as {env.POD_IP}:8080")
	}
	h.instanceName = caddy.NewReplacer().ReplaceAll(h.InstanceName, "")
	if h.instanceName == "" {
		h.instanceName = caddy.NewReplacer().ReplaceAll(h.Advertise, "")
	}
	return nil
}

// pinned says whether sessions live in this instance's own upstream.
func (h *Handler) pinned() bool { return h.UpstreamSessions == upstreamSessionsInstance }

// instanceID is the ID a new session table gets: named for instance_name
// with upstream_sessions instance, so that it survives a restart; else
// new at each start.
func (h *Handler) instanceID() string {
	if h.pinned() {
		return owner.IDFor(h.instanceName, h.Name)
	}
	return owner.NewID()
}

// validateOwnerOrder checks that the state engine can record and take
// over owners, and reads advertise.
func (h *Handler) validateOwnerOrder() error {
	if !h.engineRecordsOwners() {
		return fmt.Errorf("order %s needs shared state that records session owners (state redis)", h.Order)
	}
	if h.Advertise == "" {
		return nil
	}
	h.advertise = caddy.NewReplacer().ReplaceAll(h.Advertise, "")
	host, port, err := net.SplitHostPort(h.advertise)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("advertise: want host:port where the other instances reach this one, got %q", h.advertise)
	}
	return nil
}

// Cleanup releases this config's hold on the session table; the table
// stops when no config uses it.
func (h *Handler) Cleanup() error {
	h.releaseClaim()
	h.keySecrets.halt()
	if h.forwarder != nil {
		_ = h.forwarder.Cleanup()
	}
	if h.table == nil {
		return nil // provisioning failed before the table was taken
	}
	h.applied.cleanedUp(h.table, h.generation)
	if h.owners != nil && h.ownerConfigs.Add(-1) == 0 {
		// The last config ordering this table's sessions by owner stops:
		// Caddy stops, or a reload drops the site or turns order owner off.
		h.handOver()
	}
	if h.releaseEngine != nil {
		h.releaseEngine()
	}
	_, err := tables.Delete(h.poolKey)
	return err
}

// tables holds the session tables by name across config reloads, under
// poolKeyPrefix + name.
var tables = caddy.NewUsagePool()

const poolKeyPrefix = "mcp_serializer/"

// tableClock is the clock of the session tables created from now on: its
// timers run init_timeout and queue_timeout. Unset, the system's; tests
// set one they move by hand.
var tableClock atomic.Pointer[serializer.Clock]

func newTableClock() serializer.Clock {
	if c := tableClock.Load(); c != nil {
		return *c
	}
	return nil // NewTable's default, the system clock
}

// pooledTable lets the usage pool stop a table's janitor.
type pooledTable struct {
	*serializer.Table
	applied *appliedSettings
	owners  *owner.Directory // this instance's, for order owner
	proofs  *proofs          // for key basic_user
	// ownerConfigs counts the provisioned configs that use owners.
	ownerConfigs *atomic.Int32
	forwardLines *forwardLines // for order owner
}

func (t pooledTable) Destruct() error {
	t.owners.Members().Stop(context.Background(), nil)
	t.Close()
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Destructor            = pooledTable{}
	_ http.Flusher                = (*exchangeWriter)(nil)
)
