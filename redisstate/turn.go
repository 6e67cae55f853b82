package redisstate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

// Cluster turns on Redis (`order cluster`): one hash per session under
// key_prefix + the SHA-256 of its id + ":turn", with fields holder, until
// (unix ms) and waiting (token:arrival-in-unix-ms, space-separated, in
// arrival order), kept for serializer.TurnLineTTL after its last change.
// Asks ("want <key> <token> <age ms>"), hand-ons and gates opened
// ("<key>") are announced on the channel key_prefix + "changed".

// turnScript is serializer.TurnLine's methods, line for line, on the hash
// KEYS[1], atomically. ARGV: op (take, claim, renew, release), token,
// lease (ms), claim window (ms), the line's life (ms), channel, the
// session's key, now in unix ms ("" for the server's clock, so that
// instances' clocks never disagree about a lease or an arrival), "1" for a
// claim that announces its ask again, and how long ago the asking request
// arrived (ms). It answers {a, behind, announced}: a is, for take and
// claim, the state (0 waiting, 1 served, 2 passed over), for renew
// whether the token holds the turn, for release whether the turn was
// handed on; behind, for a token holding the turn, how long ago the first
// request waiting behind it arrived (ms; -1 if none). announced is 1 if an
// announcement went out, -1 if the server refused it (an ACL without the
// channel: pcall keeps that from undoing the change), 0 if none was due.
var turnScript = redis.NewScript(`
local K = KEYS[1]
local op, token, lease, claim = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now
if ARGV[8] ~= '' then
  now = tonumber(ARGV[8])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local f = redis.call('HMGET', K, 'holder', 'until', 'waiting')
local holder, untilms = f[1] or '', tonumber(f[2] or '0')
local waiting = {}
for tok, at in string.gmatch(f[3] or '', '(%S+):(%d+)') do
  waiting[#waiting + 1] = {tok, tonumber(at)}
end
local function indexOf(tok)
  for i, w in ipairs(waiting) do
    if w[1] == tok then return i end
  end
  return nil
end
local function advance()
  holder, untilms = '', now
  if #waiting > 0 then
    holder = table.remove(waiting, 1)[1]
    untilms = now + claim
  end
end
local function passOver()
  while holder ~= '' and now > untilms do
    advance()
  end
end
local function announce(msg)
  local r = redis.pcall('PUBLISH', ARGV[6], msg)
  if type(r) == 'table' and r.err then return -1 end
  return 1
end
local function behind()
  if #waiting > 0 then return now - waiting[1][2] end
  return -1
end
local function announceAsk()
  return announce('want ' .. ARGV[7] .. ' ' .. token .. ' ' .. ARGV[10])
end
local a, b, announced = 0, -1, 0
if op == 'take' then
  passOver()
  if holder == '' then holder = token end
  if holder == token then
    untilms = now + lease
    a, b = 1, behind()
  else
    if not indexOf(token) then
      local arrived = now - tonumber(ARGV[10])
      local i = #waiting
      while i > 0 and waiting[i][2] > arrived do
        i = i - 1
      end
      table.insert(waiting, i + 1, {token, arrived})
    end
    announced = announceAsk()
  end
elseif op == 'claim' then
  passOver()
  if holder == token then
    untilms = now + lease
    a, b = 1, behind()
  elseif indexOf(token) then
    if ARGV[9] == '1' then announced = announceAsk() end
  else
    a = 2
  end
elseif op == 'renew' then
  if holder == '' and untilms == 0 then holder = token end
  if holder == token then
    untilms = now + lease
    a, b = 1, behind()
  end
elseif op == 'release' then
  if holder == token then
    advance()
    if holder ~= '' then
      a = 1
      announced = announce(ARGV[7])
    end
  else
    local i = indexOf(token)
    if i then table.remove(waiting, i) end
  end
end
local line = {}
for i, w in ipairs(waiting) do
  line[i] = w[1] .. ':' .. string.format('%d', w[2])
end
redis.call('HSET', K, 'holder', holder, 'until', string.format('%d', untilms), 'waiting', table.concat(line, ' '))
redis.call('PEXPIRE', K, ARGV[5])
return {a, b, announced}
`)

// Turn states as turnScript answers them.
var scriptTurnStates = [...]serializer.TurnState{0: serializer.TurnWaiting, 1: serializer.TurnServed, 2: serializer.TurnPassedOver}

// announcePrefix marks an ask among the channel's messages.
const announcePrefix = "want "

func (r *Engine) changedChannel() string { return r.KeyPrefix + "changed" }

// turnAnswer is turnScript's answer.
type turnAnswer struct {
	a      int64
	behind time.Duration // serializer.NobodyWaiting if none waits
}

// runTurn runs turnScript for key at now (zero: the server's clock).
func (r *Engine) runTurn(ctx context.Context, key, op, token string, age, lease, claim time.Duration, nudge bool, now time.Time) (turnAnswer, error) {
	at, again := "", "0"
	if !now.IsZero() {
		at = fmt.Sprint(now.UnixMilli())
	}
	if nudge {
		again = "1"
	}
	v, err := turnScript.Run(ctx, r.client, []string{r.KeyPrefix + key + ":turn"},
		op, token, lease.Milliseconds(), claim.Milliseconds(), serializer.TurnLineTTL.Milliseconds(),
		r.changedChannel(), key, at, again, max(age, 0).Milliseconds()).Int64Slice()
	if err != nil {
		return turnAnswer{0, serializer.NobodyWaiting}, err
	}
	if len(v) != 3 || v[0] < 0 || v[0] > 2 {
		return turnAnswer{0, serializer.NobodyWaiting}, fmt.Errorf("%s: unexpected answer %v", op, v)
	}
	r.announced(v[2])
	behind := serializer.NobodyWaiting
	if v[1] >= 0 {
		behind = time.Duration(v[1]) * time.Millisecond
	}
	return turnAnswer{v[0], behind}, nil
}

// TakeTurn asks for the session key's turn under token, for a request
// that arrived age ago.
func (r *Engine) TakeTurn(ctx context.Context, key, token string, age, lease, claim time.Duration) (serializer.TurnState, time.Duration, error) {
	return r.takeAt(ctx, key, token, age, lease, claim, time.Time{})
}

func (r *Engine) takeAt(ctx context.Context, key, token string, age, lease, claim time.Duration, now time.Time) (serializer.TurnState, time.Duration, error) {
	v, err := r.runTurn(ctx, key, "take", token, age, lease, claim, false, now)
	return scriptTurnStates[v.a], v.behind, err
}

// ClaimTurn says where token stands.
func (r *Engine) ClaimTurn(ctx context.Context, key, token string, age, lease, claim time.Duration, nudge bool) (serializer.TurnState, time.Duration, error) {
	return r.claimAt(ctx, key, token, age, lease, claim, nudge, time.Time{})
}

func (r *Engine) claimAt(ctx context.Context, key, token string, age, lease, claim time.Duration, nudge bool, now time.Time) (serializer.TurnState, time.Duration, error) {
	v, err := r.runTurn(ctx, key, "claim", token, age, lease, claim, nudge, now)
	return scriptTurnStates[v.a], v.behind, err
}

// RenewTurn extends the holder's lease.
func (r *Engine) RenewTurn(ctx context.Context, key, token string, lease time.Duration) (bool, time.Duration, error) {
	return r.renewAt(ctx, key, token, lease, time.Time{})
}

func (r *Engine) renewAt(ctx context.Context, key, token string, lease time.Duration, now time.Time) (bool, time.Duration, error) {
	v, err := r.runTurn(ctx, key, "renew", token, 0, lease, 0, false, now)
	return v.a == 1, v.behind, err
}

// ReleaseTurn hands the turn on, or withdraws an ask.
func (r *Engine) ReleaseTurn(ctx context.Context, key, token string, claim time.Duration) error {
	_, err := r.releaseAt(ctx, key, token, claim, time.Time{})
	return err
}

func (r *Engine) releaseAt(ctx context.Context, key, token string, claim time.Duration, now time.Time) (bool, error) {
	v, err := r.runTurn(ctx, key, "release", token, 0, 0, claim, false, now)
	return v.a == 1, err
}

// announcements is what the engine knows of its channel: whether its
// subscription is confirmed and whether the server lets it publish.
type announcements struct {
	hearing atomic.Bool
	refused atomic.Bool // the last publish was refused
	warned  sync.Once   // the refusal's WARN
}

// announced records the outcome of a publish: 1 sent, -1 refused, 0 none.
func (r *Engine) announced(outcome int64) {
	switch outcome {
	case 1:
		r.announcements.refused.Store(false)
	case -1:
		if !r.announcements.refused.Swap(true) {
			r.announcements.warned.Do(func() { r.warnRefused("publish") })
		}
	}
}

// Announcing reports whether announcements go out and come in.
func (r *Engine) Announcing() bool {
	return r.announcements.hearing.Load() && !r.announcements.refused.Load()
}

func (r *Engine) warnRefused(what string) {
	r.logger.Warn("Redis refuses this user the announcement channel; cluster turns work on by reading, "+
		"handing each session's turn on after every exchange (grant the channel to make them free on a sticky front)",
		zap.String("refused", what), zap.String("channel", r.changedChannel()),
		zap.String("acl", "ACL SETUSER <user> &"+r.changedChannel()))
}

// Watch calls changed for every announcement until stop. A subscription
// that fails is made again after a pause: soon after a connection error,
// rarely after an ACL refusal. What is announced meanwhile is lost, which
// the table's backoff covers.
func (r *Engine) Watch(changed func(key, asker string, waited time.Duration)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var current *redis.PubSub
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			sub := r.client.Subscribe(ctx, r.changedChannel())
			mu.Lock()
			current = sub
			mu.Unlock()
			pause := r.listen(ctx, sub, changed)
			r.announcements.hearing.Store(false)
			_ = sub.Close()
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
		}
	}()
	return func() {
		cancel()
		mu.Lock()
		if current != nil {
			_ = current.Close()
		}
		mu.Unlock()
		<-done
	}
}

// Pauses before subscribing again.
const (
	resubscribeAfterError   = time.Second
	resubscribeAfterRefusal = 30 * time.Second
)

// listen confirms sub's subscription, then passes its messages on until
// it ends; it returns how long to pause before the next.
func (r *Engine) listen(ctx context.Context, sub *redis.PubSub, changed func(key, asker string, waited time.Duration)) time.Duration {
	if _, err := sub.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		if redis.HasErrorPrefix(err, "NOPERM") {
			r.announcements.warned.Do(func() { r.warnRefused("subscribe") })
			return resubscribeAfterRefusal
		}
		return resubscribeAfterError
	}
	r.announcements.hearing.Store(true)
	for msg := range sub.Channel() {
		changed(parseAnnouncement(msg.Payload))
	}
	return resubscribeAfterError
}

// parseAnnouncement reads a message of the channel: "<key>", or "want
// <key> <token> <age ms>" for an ask.
func parseAnnouncement(msg string) (key, asker string, waited time.Duration) {
	rest, ok := strings.CutPrefix(msg, announcePrefix)
	if !ok {
		return msg, "", 0
	}
	key, rest, _ = strings.Cut(rest, " ")
	asker, age, _ := strings.Cut(rest, " ")
	ms, _ := strconv.ParseInt(age, 10, 64)
	return key, asker, time.Duration(max(ms, 0)) * time.Millisecond
}

var _ stateengine.TurnKeeper = (*Engine)(nil)
