package caddymodule

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Cluster turns on Redis (`order cluster`): one hash per session under
// key_prefix + the SHA-256 of its id + ":turn", with fields next, serving,
// until (unix ms) and w<ticket> for withdrawn tickets, kept for
// serializer.TurnLineTTL after its last change. Hand-ons and gates opened
// are announced on the channel key_prefix + "changed", the key as message.

// turnScript is serializer.TicketLine's methods, line for line (a new
// line's tickets numbered from its start in microseconds), on the
// hash KEYS[1], atomically. ARGV: op (take, claim, renew, release),
// ticket, lease (ms), claim window (ms), the line's life (ms), channel,
// the session's key, and now in unix ms ("" for the server's clock, so
// that instances' clocks never disagree about a lease).
var turnScript = redis.NewScript(`
local K = KEYS[1]
local op, ticket, lease, claim = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now
if ARGV[8] ~= '' then
  now = tonumber(ARGV[8])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local f = redis.call('HMGET', K, 'next', 'serving', 'until')
local nxt, serving, untilms = tonumber(f[1] or '0'), tonumber(f[2] or '0'), tonumber(f[3] or '0')
local function advance()
  serving = serving + 1
  while redis.call('HDEL', K, string.format('w%d', serving)) == 1 do
    serving = serving + 1
  end
  untilms = now + claim
end
local function passOver()
  while serving ~= 0 and serving <= nxt and now > untilms do
    advance()
  end
end
local result = 0
if op == 'take' then
  passOver()
  if serving == 0 then
    nxt = now * 1000
    serving = nxt + 1
  end
  nxt = nxt + 1
  if serving == nxt then
    untilms = now + lease
    result = {nxt, 1}
  else
    result = {nxt, 0}
  end
elseif op == 'claim' then
  passOver()
  if ticket == serving and ticket <= nxt then
    untilms = now + lease
    result = 1
  elseif ticket < serving or ticket > nxt then
    result = 2
  end
elseif op == 'renew' then
  if ticket == serving and ticket <= nxt then
    untilms = now + lease
    result = 1
  end
elseif op == 'release' then
  if ticket == serving and ticket <= nxt then
    advance()
    if serving <= nxt then
      redis.call('PUBLISH', ARGV[6], ARGV[7])
      result = 1
    end
  elseif ticket > serving and ticket <= nxt then
    redis.call('HSET', K, string.format('w%d', ticket), '1')
  end
end
redis.call('HSET', K, 'next', string.format('%d', nxt), 'serving', string.format('%d', serving), 'until', string.format('%d', untilms))
redis.call('PEXPIRE', K, ARGV[5])
return result
`)

// Ticket states as turnScript answers them.
var scriptTicketStates = [...]serializer.TicketState{0: serializer.TicketWaiting, 1: serializer.TicketServed, 2: serializer.TicketPassedOver}

func (r *RedisState) changedChannel() string { return r.KeyPrefix + "changed" }

// runTurn runs turnScript for key at now (zero: the server's clock).
func (r *RedisState) runTurn(ctx context.Context, key, op string, ticket int64, lease, claim time.Duration, now time.Time) (any, error) {
	at := ""
	if !now.IsZero() {
		at = fmt.Sprint(now.UnixMilli())
	}
	return turnScript.Run(ctx, r.client, []string{r.KeyPrefix + key + ":turn"},
		op, ticket, lease.Milliseconds(), claim.Milliseconds(), serializer.TurnLineTTL.Milliseconds(),
		r.changedChannel(), key, at).Result()
}

// TakeTicket queues a request of the session key.
func (r *RedisState) TakeTicket(ctx context.Context, key string, lease, claim time.Duration) (int64, serializer.TicketState, error) {
	return r.takeAt(ctx, key, lease, claim, time.Time{})
}

func (r *RedisState) takeAt(ctx context.Context, key string, lease, claim time.Duration, now time.Time) (int64, serializer.TicketState, error) {
	v, err := r.runTurn(ctx, key, "take", 0, lease, claim, now)
	if err != nil {
		return 0, 0, err
	}
	pair, ok := v.([]any)
	if !ok || len(pair) != 2 {
		return 0, 0, fmt.Errorf("take: unexpected answer %v", v)
	}
	ticket, _ := pair[0].(int64)
	served, _ := pair[1].(int64)
	return ticket, scriptTicketStates[min(served, 1)], nil
}

// ClaimTicket says where ticket stands.
func (r *RedisState) ClaimTicket(ctx context.Context, key string, ticket int64, lease, claim time.Duration) (serializer.TicketState, error) {
	return r.claimAt(ctx, key, ticket, lease, claim, time.Time{})
}

func (r *RedisState) claimAt(ctx context.Context, key string, ticket int64, lease, claim time.Duration, now time.Time) (serializer.TicketState, error) {
	v, err := r.runTurn(ctx, key, "claim", ticket, lease, claim, now)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok || n < 0 || n > 2 {
		return 0, fmt.Errorf("claim: unexpected answer %v", v)
	}
	return scriptTicketStates[n], nil
}

// RenewTicket extends a served ticket's lease.
func (r *RedisState) RenewTicket(ctx context.Context, key string, ticket int64, lease time.Duration) (bool, error) {
	return r.renewAt(ctx, key, ticket, lease, time.Time{})
}

func (r *RedisState) renewAt(ctx context.Context, key string, ticket int64, lease time.Duration, now time.Time) (bool, error) {
	v, err := r.runTurn(ctx, key, "renew", ticket, lease, 0, now)
	n, _ := v.(int64)
	return n == 1, err
}

// ReleaseTicket hands the turn on, or withdraws a waiting ticket.
func (r *RedisState) ReleaseTicket(ctx context.Context, key string, ticket int64, claim time.Duration) error {
	_, err := r.releaseAt(ctx, key, ticket, claim, time.Time{})
	return err
}

func (r *RedisState) releaseAt(ctx context.Context, key string, ticket int64, claim time.Duration, now time.Time) (bool, error) {
	v, err := r.runTurn(ctx, key, "release", ticket, 0, claim, now)
	n, _ := v.(int64)
	return n == 1, err
}

// Announce tells every instance that the session key's record changed.
func (r *RedisState) Announce(ctx context.Context, key string) error {
	return r.client.Publish(ctx, r.changedChannel(), key).Err()
}

// Watch calls changed with the key of every announcement until stop. The
// subscription reconnects by itself; what is announced meanwhile is lost,
// which the table's backoff covers.
func (r *RedisState) Watch(changed func(key string)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sub := r.client.Subscribe(ctx, r.changedChannel())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range sub.Channel() {
			changed(msg.Payload)
		}
	}()
	return func() {
		cancel()
		_ = sub.Close()
		<-done
	}
}

var _ TurnEngine = (*RedisState)(nil)
