package caddymodule

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// metrics are made once and registered into each config's registry.
// Labels are bounded sets; a session id is never one.
var metrics = struct {
	sessions    prometheus.GaugeFunc
	queueWait   prometheus.Histogram
	gateHolds   prometheus.Counter
	gateTimeout *prometheus.CounterVec
	rejections  *prometheus.CounterVec
	bypasses    *prometheus.CounterVec
	sessionless prometheus.Counter // bypasses{kind="sessionless"}, looked up once
	overtakes   prometheus.Counter // bypasses{kind="overtake"}
	evictions   *prometheus.CounterVec
	evictedOpen prometheus.Counter // evictions{gate="open"}
	evictedInit prometheus.Counter // evictions{gate="initializing"}
	stateErrors *prometheus.CounterVec
	forwards    *prometheus.CounterVec
	forwardTime prometheus.Histogram
	takeovers   prometheus.CounterFunc
	proofs      *prometheus.CounterVec
	proofWait   prometheus.Histogram
	keySecrets  prometheus.GaugeFunc
	sharedIDs   prometheus.GaugeFunc
}{}

func init() {
	const ns, sub = "caddy", "mcp_serializer"
	metrics.sessions = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "sessions",
		Help: "MCP sessions tracked, across all session tables.",
	}, trackedSessions)
	metrics.queueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "queue_wait_seconds",
		Help:    "Time a request waited for its session's turn (queue and gate) before going upstream.",
		Buckets: []float64{0.0001, 0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30},
	})
	metrics.gateHolds = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "gate_holds_total",
		Help: "Requests held until their session's notifications/initialized was acknowledged.",
	})
	metrics.gateTimeout = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "gate_timeouts_total",
		Help: "Sessions whose notifications/initialized was not acknowledged within init_timeout, by action taken.",
	}, []string{"action"})
	metrics.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "rejections_total",
		Help: "Requests answered locally and not forwarded, by reason.",
	}, []string{"reason"})
	metrics.bypasses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "bypasses_total",
		Help: "Requests forwarded without waiting: sessionless (no Mcp-Session-Id) or overtake (replies beside a streaming exchange).",
	}, []string{"kind"})
	metrics.sessionless = metrics.bypasses.WithLabelValues("sessionless")
	metrics.overtakes = metrics.bypasses.WithLabelValues("overtake")
	metrics.evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "evictions_total",
		Help: "Idle sessions forgotten to stay within max_sessions, by gate: open, or initializing (the client never sent notifications/initialized; evicted, oldest first, only when no idle open session was left).",
	}, []string{"gate"})
	metrics.evictedOpen = metrics.evictions.WithLabelValues("open")
	metrics.evictedInit = metrics.evictions.WithLabelValues("initializing")
	metrics.stateErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "state_errors_total",
		Help: "Calls to the shared session state engine that failed or timed out, by operation.",
	}, []string{"op"})
	metrics.forwards = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "forwards_total",
		Help: "Requests sent to the instance owning their session (order owner), by result: forwarded (answered by the owner), unreachable (not dialed: tried again while its lease stands), not_owner (the instance there does not serve the session: its owner read again), foreign (answered by something other than the owner: not passed on), failed (sent, then no answer).",
	}, []string{"result"})
	metrics.forwardTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "forward_seconds",
		Help:    "Time from sending a request to its session's owner to the owner's response headers (order owner): the hop and the owner's queue and upstream.",
		Buckets: []float64{0.0005, 0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30},
	})
	metrics.takeovers = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "takeovers_total",
		Help: "Sessions this instance took over from an owner that did not answer (order owner).",
	}, takenOver)
	metrics.proofs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "proofs_total",
		Help: "Credentials proven at key_proof (key basic_user), by verdict: accepted (2xx: they join their user's line), refused (401: they join none), undecided (any other answer, or none), full (max_queue of the user's proofs already waited), timeout (the user's earlier proofs took queue_timeout), abandoned (every request waiting for it left first).",
	}, []string{"verdict"})
	metrics.proofWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "proof_wait_seconds",
		Help:    "Time a request waited for its credential's proof (key basic_user), not counted in queue_wait_seconds.",
		Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30},
	})
	metrics.sharedIDs = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "instance_id_shared",
		Help: "Handlers (order owner) whose instance ID another instance renewed within the last minute: two instances run under one instance_name, and one session's requests can run on both at once.",
	}, instanceIDsShared)
	metrics.keySecrets = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "key_secret_differs",
		Help: "Handlers (key with order owner) whose key_secret differs from the fingerprint the other instances of their table recorded in the shared state: one key's requests can then run on two instances at once.",
	}, keySecretsDiffering)
}

func registerMetrics(registry *prometheus.Registry) {
	if registry == nil {
		return
	}
	for _, c := range []prometheus.Collector{
		metrics.sessions, metrics.queueWait, metrics.gateHolds, metrics.gateTimeout,
		metrics.rejections, metrics.bypasses, metrics.evictions, metrics.stateErrors,
		metrics.forwards, metrics.forwardTime, metrics.takeovers, metrics.proofs, metrics.proofWait, metrics.keySecrets, metrics.sharedIDs,
	} {
		if err := registry.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err)
			}
		}
	}
}

// sharedIDWarns spaces the ERROR lines about an instance ID two
// instances renew.
var sharedIDWarns warnlimit.Limiter

// sharedRecently is how long after a renewal found its lease renewed by
// another instance instance_id_shared still counts it.
const sharedRecently = time.Minute

// instanceIDsShared counts the live tables whose instance ID another
// instance renewed within sharedRecently.
func instanceIDsShared() float64 {
	n, now := 0, time.Now()
	tables.Range(func(_, v any) bool {
		if at, _ := v.(pooledTable).owners.Members().Shared(); !at.IsZero() && now.Sub(at) < sharedRecently {
			n++
		}
		return true
	})
	return float64(n)
}

// takenOver sums the takeovers of every live table.
func takenOver() float64 {
	var n int64
	tables.Range(func(_, v any) bool {
		n += v.(pooledTable).owners.TakeOvers()
		return true
	})
	return float64(n)
}

// trackedSessions sums the sessions of every live table, at scrape time.
func trackedSessions() float64 {
	n := 0
	tables.Range(func(_, v any) bool {
		n += v.(pooledTable).Len()
		return true
	})
	return float64(n)
}

// events turns a table's events into metrics and log lines.
type events struct {
	logger *zap.Logger
	// gateWarns spaces the gate-timeout WARNs: every client that never
	// sends initialized causes one. nil logs each.
	gateWarns *warnlimit.Limiter
	now       func() time.Time // nil: time.Now
}

func newEvents(logger *zap.Logger) events {
	return events{logger: logger, gateWarns: new(warnlimit.Limiter)}
}

func (events) Waited(d time.Duration) { metrics.queueWait.Observe(d.Seconds()) }

func (events) Held() { metrics.gateHolds.Inc() }

// GateTimedOut counts every gate timeout and logs at most one WARN per
// warnlimit.Interval, naming how many it held back since the last.
func (e events) GateTimedOut(id string, action serializer.TimeoutAction) {
	metrics.gateTimeout.WithLabelValues(action.String()).Inc()
	if ok, suppressed := e.allow(e.gateWarns); ok {
		e.logger.Warn("notifications/initialized not acknowledged within init_timeout",
			zap.String("session", serializer.SessionHash(id)), zap.Stringer("action", action),
			zap.Int("suppressed", suppressed))
	}
}

// allow asks limit whether a WARN may go out now; a nil limit lets each.
func (e events) allow(limit *warnlimit.Limiter) (ok bool, suppressed int) {
	if limit == nil {
		return true, 0
	}
	now := time.Now
	if e.now != nil {
		now = e.now
	}
	return limit.Allow(now())
}

func (events) Evicted(gated bool) {
	if gated {
		metrics.evictedInit.Inc()
	} else {
		metrics.evictedOpen.Inc()
	}
}

func (e events) Adopted(id string, gated bool) {
	if c := e.logger.Check(zapcore.DebugLevel, "session met first here, looked up in shared state"); c != nil {
		c.Write(zap.String("session", serializer.SessionHash(id)), zap.Bool("gated", gated))
	}
}
