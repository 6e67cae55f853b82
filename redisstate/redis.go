package redisstate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/settings"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

func init() {
	caddy.RegisterModule(Engine{})
}

const (
	defaultRedisAddress   = "127.0.0.1:6379"
	defaultRedisKeyPrefix = "mcp_serializer:"
	defaultRedisTimeout   = 250 * time.Millisecond
)

// Engine shares session records through Redis (or Valkey): one hash
// per session under key_prefix + the SHA-256 of its id, with fields open,
// deadline (unix ms) and inflight, expiring after session_ttl.
type Engine struct {
	// host:port of the server. Several addresses are the seed nodes of a
	// Redis Cluster. Placeholders such as {env.REDIS_ADDR} are resolved.
	// Default: 127.0.0.1:6379 (none with sentinel).
	Address []string `json:"address,omitempty"`
	// The one address is a Redis Cluster's (a managed service's
	// configuration endpoint): a cluster client, which follows MOVED.
	Cluster bool `json:"cluster,omitempty"`
	// host:port of the Sentinels that watch MasterName, instead of
	// Address: the client asks them for the master and follows failovers.
	Sentinel   []string `json:"sentinel,omitempty"`
	MasterName string   `json:"master_name,omitempty"`
	// The Sentinels' own ACL user and password, if they need one
	// (placeholders resolved).
	SentinelUsername string `json:"sentinel_username,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// ACL user name and password (placeholders resolved, so the password
	// can stay out of the config: {env.REDIS_PASSWORD}).
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// Database number; a cluster has only 0. Default: 0.
	DB int `json:"db,omitempty"`
	// Connect with TLS. Any tls_* setting implies it.
	TLS bool `json:"tls,omitempty"`
	// Name to verify the server's certificate against. Default: the host
	// of the address.
	TLSServerName string `json:"tls_server_name,omitempty"`
	// Accept any server certificate (testing only).
	TLSInsecureSkipVerify bool `json:"tls_insecure_skip_verify,omitempty"`
	// PEM file of the CAs to trust instead of the system's.
	TLSCAFile string `json:"tls_ca_file,omitempty"`
	// PEM files of a client certificate and its key, for a server that
	// requires one (mutual TLS); checked when the config loads.
	// Placeholders resolved.
	TLSCertFile string `json:"tls_cert_file,omitempty"`
	TLSKeyFile  string `json:"tls_key_file,omitempty"`
	// Prefix of every key. Default: "mcp_serializer:".
	KeyPrefix string `json:"key_prefix,omitempty"`
	// Longest wait for one call; a call that takes longer counts as
	// failed and the handler carries on locally. Default: 250ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	client  redis.UniversalClient
	poolKey string
	logger  *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Engine) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mcp_serializer.state.redis",
		New: func() caddy.Module { return new(Engine) },
	}
}

// redisConn is what identifies a shared client: configs with the same
// connection settings share one across reloads, so a reload does not drop
// connections under writes in flight.
type redisConn struct {
	Addrs            []string // the server, the cluster's seeds, or the sentinels
	Cluster          bool
	MasterName       string
	Username         string
	Password         string
	SentinelUsername string
	SentinelPassword string
	DB               int
	TLS              bool
	ServerName       string
	Insecure         bool
	CAFile           string
	CertFile         string
	KeyFile          string
}

// redisClients holds the clients by connection settings across reloads.
var redisClients = caddy.NewUsagePool()

type pooledRedis struct{ redis.UniversalClient }

func (c pooledRedis) Destruct() error { return c.Close() }

// Provision applies defaults, checks the settings (Validate), resolves
// placeholders and attaches to the shared client for these connection
// settings. It does not connect: an engine that is down at start degrades
// the handler, it does not stop Caddy.
func (r *Engine) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	if len(r.Address) == 0 && len(r.Sentinel) == 0 && !r.Cluster {
		r.Address = []string{defaultRedisAddress}
	}
	if r.Timeout == 0 {
		r.Timeout = caddy.Duration(defaultRedisTimeout)
	}
	if r.KeyPrefix == "" {
		r.KeyPrefix = defaultRedisKeyPrefix
	}
	// Checked before the client is shared, so that a refused config opens
	// none; Caddy runs Validate again after.
	if err := r.Validate(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	conn := redisConn{
		Cluster:          r.clusterClient(),
		MasterName:       repl.ReplaceKnown(r.MasterName, ""),
		Username:         repl.ReplaceKnown(r.Username, ""),
		Password:         repl.ReplaceKnown(r.Password, ""),
		SentinelUsername: repl.ReplaceKnown(r.SentinelUsername, ""),
		SentinelPassword: repl.ReplaceKnown(r.SentinelPassword, ""),
		DB:               r.DB,
		TLS:              r.TLS || r.TLSServerName != "" || r.TLSInsecureSkipVerify || r.TLSCAFile != "" || r.TLSCertFile != "",
		ServerName:       repl.ReplaceKnown(r.TLSServerName, ""),
		Insecure:         r.TLSInsecureSkipVerify,
		CAFile:           repl.ReplaceKnown(r.TLSCAFile, ""),
		CertFile:         repl.ReplaceKnown(r.TLSCertFile, ""),
		KeyFile:          repl.ReplaceKnown(r.TLSKeyFile, ""),
	}
	for _, list := range []struct {
		setting string
		addrs   []string
	}{{"address", r.Address}, {"sentinel", r.Sentinel}} {
		for _, a := range list.addrs {
			addr := repl.ReplaceKnown(a, "")
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return fmt.Errorf("%s %q: want host:port: %v", list.setting, a, err)
			}
			conn.Addrs = append(conn.Addrs, addr)
		}
	}
	opts, err := conn.options()
	if err != nil {
		return err
	}
	key, err := json.Marshal(conn)
	if err != nil {
		return err
	}
	r.poolKey = string(key)
	val, _, err := redisClients.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		return pooledRedis{redis.NewUniversalClient(opts)}, nil
	})
	if err != nil {
		return err
	}
	r.client = val.(pooledRedis).UniversalClient
	return nil
}

// clusterClient tells whether the settings name a Redis Cluster.
func (r *Engine) clusterClient() bool { return r.Cluster || len(r.Address) > 1 }

// Validate refuses settings out of range or that cannot go together,
// naming them: one way to find the server, and a client certificate with
// its key.
func (r *Engine) Validate() error {
	switch {
	case len(r.Sentinel) > 0 && len(r.Address) > 0:
		return errors.New("sentinel and address together: with sentinel, give the sentinels' addresses only (the master is found through them)")
	case len(r.Sentinel) > 0 && r.Cluster:
		return errors.New("sentinel and cluster together: a Redis Cluster has no sentinels")
	case len(r.Sentinel) > 0 && r.MasterName == "":
		return errors.New("sentinel needs master_name, the name the sentinels watch the master by")
	case len(r.Sentinel) == 0 && r.MasterName != "":
		return errors.New("master_name needs sentinel, the sentinels' addresses")
	case len(r.Sentinel) == 0 && (r.SentinelUsername != "" || r.SentinelPassword != ""):
		return errors.New("sentinel_username and sentinel_password need sentinel")
	case r.Cluster && len(r.Address) == 0:
		return errors.New("cluster needs address, the cluster's configuration endpoint")
	case r.TLSCertFile != "" && r.TLSKeyFile == "":
		return errors.New("tls_cert_file needs tls_key_file, the certificate's private key")
	case r.TLSKeyFile != "" && r.TLSCertFile == "":
		return errors.New("tls_key_file needs tls_cert_file, the certificate it is the key of")
	case r.DB < 0:
		return fmt.Errorf("db must be 0 or more, got %d", r.DB)
	case r.DB != 0 && r.clusterClient():
		return fmt.Errorf("db: a Redis Cluster (cluster, or several addresses) has only db 0, got %d", r.DB)
	case r.Timeout < 0:
		return fmt.Errorf("timeout must be positive, got %s", time.Duration(r.Timeout))
	}
	return nil
}

// options makes the client's settings: one address is a plain client,
// several (or cluster) a cluster client, sentinels a failover client.
func (c redisConn) options() (*redis.UniversalOptions, error) {
	opts := &redis.UniversalOptions{
		Addrs:            c.Addrs,
		IsClusterMode:    c.Cluster,
		MasterName:       c.MasterName,
		Username:         c.Username,
		Password:         c.Password,
		SentinelUsername: c.SentinelUsername,
		SentinelPassword: c.SentinelPassword,
		DB:               c.DB,
		// Each call's context carries the engine's timeout; socket
		// timeouts follow it instead of go-redis' own 3s.
		ContextTimeoutEnabled: true,
		// A connection being dialled may outlive the call that started
		// it and serve the next one.
		DialTimeout: 2 * time.Second,
		// A refused dial fails the call at once; go-redis' own five
		// attempts would outlast any call's timeout.
		DialerRetries: 1,
		// One retry: a reset connection (Redis restarted) gets a fresh
		// one within the same call.
		MaxRetries: 1,
		// Fewer round trips on a new connection, within the first call's
		// timeout: no CLIENT SETINFO, no maintenance notifications
		// (a managed-service feature that Redis 7 and Valkey lack).
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if c.TLS {
		opts.TLSConfig = &tls.Config{
			MinVersion:         tls.VersionTLS12,
			ServerName:         c.ServerName,
			InsecureSkipVerify: c.Insecure, //nolint:gosec // operator's explicit choice
		}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, fmt.Errorf("tls_ca_file: %v", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls_ca_file: no PEM certificate in %s", c.CAFile)
			}
			opts.TLSConfig.RootCAs = pool
		}
		if c.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("tls_cert_file, tls_key_file: %v", err)
			}
			opts.TLSConfig.Certificates = []tls.Certificate{cert}
		}
	}
	return opts, nil
}

// Cleanup releases this config's hold on the shared client; it closes
// when no config uses it.
func (r *Engine) Cleanup() error {
	if r.poolKey == "" {
		return nil
	}
	_, err := redisClients.Delete(r.poolKey)
	return err
}

// Retain keeps the shared client open until release, whatever order
// Caddy cleans modules up in (stateengine.Retainer).
func (r *Engine) Retain() (release func()) {
	if r.poolKey == "" {
		return func() {}
	}
	if _, _, err := redisClients.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		return nil, errors.New("the client is gone")
	}); err != nil {
		return func() {}
	}
	var once sync.Once
	return func() { once.Do(func() { _, _ = redisClients.Delete(r.poolKey) }) }
}

// Abilities: writes in batches (one pipeline), and session owners taken
// over and claimed.
func (r *Engine) Abilities() stateengine.Abilities {
	return stateengine.Abilities{Batch: r.Writes, TakeOver: r.TakeOver, ClaimOwner: r.ClaimOwner,
		MarkRunning: r.MarkRunning, RunningFor: r.RunningFor,
		RenewLease: r.RenewLease, DropLease: r.DropLease, Members: r.Members}
}

// CallTimeout bounds each call.
func (r *Engine) CallTimeout() time.Duration { return time.Duration(r.Timeout) }

// createScript writes a fresh record. KEYS[1] the record; ARGV: init
// deadline (unix ms), the record's life (ms, serializer.RecordTTL's), the
// session's owner ("" for none).
var createScript = redis.NewScript(`
redis.call('HSET', KEYS[1], 'open', '0', 'deadline', ARGV[1], 'inflight', '1', 'owner', ARGV[3] or '')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// takeOverScript makes ARGV[2] the owner of the record KEYS[1] if
// ARGV[1] still is, or none is, and returns the owner then recorded; nil
// without a record. Run again after a lost answer, it returns the same.
// An owner whose lease in KEYS[2] (the members) stands on Redis' clock
// keeps the record whatever the instance asking believes: it may have
// renewed since that instance last listed the leases.
var takeOverScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= '' and owner == ARGV[1] and ARGV[1] ~= ARGV[2] then
  local id = string.match(owner, '^(%S+) ')
  local lease = id and redis.call('HGET', KEYS[2], id)
  if lease then
    local exp = tonumber(string.match(lease, '^(%d+) '))
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if exp and exp > now then return owner end
  end
end
if owner == false or owner == '' or owner == ARGV[1] then
  redis.call('HSET', KEYS[1], 'owner', ARGV[2])
  return ARGV[2]
end
return owner
`)

// claimScript makes ARGV[1] the owner of the record KEYS[1] unless it
// has one, and returns the owner recorded then; the record lives ARGV[2]
// ms more if ARGV[1] owns it. A key (the key setting) has no other record.
var claimScript = redis.NewScript(`
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == false or owner == '' then
  redis.call('HSET', KEYS[1], 'open', '1', 'deadline', '0', 'inflight', '0', 'owner', ARGV[1])
  owner = ARGV[1]
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'claimed_until', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2]))
end
return owner
`)

// ClaimOwner records me as the owner of the record at key unless another
// is (stateengine.Abilities.ClaimOwner).
func (r *Engine) ClaimOwner(ctx context.Context, key, me string, ttl time.Duration) (string, error) {
	return claimScript.Run(ctx, r.client, []string{r.KeyPrefix + key}, me, ttl.Milliseconds()).Text()
}

// TakeOver records to as the record's owner if from still is
// (stateengine.Abilities.TakeOver).
func (r *Engine) TakeOver(ctx context.Context, key, from, to string) (string, bool, error) {
	owner, err := takeOverScript.Run(ctx, r.client, []string{r.KeyPrefix + key, r.KeyPrefix + membersKey}, from, to).Text()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return owner, true, nil
}

// markRunningScript marks the record KEYS[1] with an exchange of ARGV[1]
// running for ARGV[2] ms more on Redis' clock, or clears the mark when
// ARGV[2] is 0, if ARGV[1] owns the record or made the mark; it never
// creates a record. A key's record (claimed_until, Redis' clock) lives at
// least as long as the mark, so that a 30 s claim does not lapse under its
// first exchange.
var markRunningScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local owner = redis.call('HGET', KEYS[1], 'owner')
local by = redis.call('HGET', KEYS[1], 'running_by')
if owner ~= ARGV[1] and by ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then
  if by == ARGV[1] then redis.call('HDEL', KEYS[1], 'running', 'running_by') end
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'running', now + tonumber(ARGV[2]), 'running_by', ARGV[1])
local claimed = redis.call('HGET', KEYS[1], 'claimed_until')
if claimed and tonumber(claimed) < now + tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[1], 'claimed_until', now + tonumber(ARGV[2]))
end
return 1
`)

// runningForScript answers how many ms the mark of the record KEYS[1]
// says an exchange still runs, on Redis' clock; 0 for none.
var runningForScript = redis.NewScript(`
local until_ms = tonumber(redis.call('HGET', KEYS[1], 'running') or '0')
if until_ms == nil or until_ms == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if until_ms <= now then return 0 end
return until_ms - now
`)

// MarkRunning marks or clears an exchange of me running on the record at
// key (stateengine.Abilities.MarkRunning).
func (r *Engine) MarkRunning(ctx context.Context, key, me string, life time.Duration) error {
	return markRunningScript.Run(ctx, r.client, []string{r.KeyPrefix + key}, me, life.Milliseconds()).Err()
}

// RunningFor reads the running mark of the record at key
// (stateengine.Abilities.RunningFor).
func (r *Engine) RunningFor(ctx context.Context, key string) (time.Duration, error) {
	ms, err := runningForScript.Run(ctx, r.client, []string{r.KeyPrefix + key}).Int64()
	return time.Duration(ms) * time.Millisecond, err
}

// The instances' leases are one hash, membersKey: field the instance ID,
// value "<expiry, unix ms on Redis' clock> <epoch> <address>", so that
// listing them is one call and no instance's clock matters. A lease that
// lapsed stays listed as lapsed for membersLife (a tombstone), so that an
// instance started after another died knows it held a lease.
const membersKey = "members"

// membersLife is how long the leases' hash, and a lapsed lease in it,
// outlive their last renewal.
const membersLife = 24 * time.Hour

// renewLeaseScript keeps the lease ARGV[1] (address ARGV[2]) for ARGV[3]
// ms more and answers its epoch (1 for a new lease, one more than before
// if it had lapsed), whether Redis had it at all, and the address it
// named if it still stood ("" if not).
var renewLeaseScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local old = redis.call('HGET', KEYS[1], ARGV[1])
local epoch = 1
local existed = 0
local holder = ''
if old then
  existed = 1
  local exp, ep, addr = string.match(old, '^(%d+) d?(%d+) (.*)$')
  if ep then
    epoch = tonumber(ep)
    if tonumber(exp) <= now then epoch = epoch + 1 else holder = addr end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[3])) .. ' ' .. epoch .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {epoch, existed, holder}
`)

// dropLeaseScript ends the lease ARGV[1] as if it had lapsed ARGV[2] ms
// ago: the others take what it still owns over at once.
var dropLeaseScript = redis.NewScript(`
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp, epoch, addr = string.match(old, '^(%d+) d?(%d+) (.*)$')
if not addr then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], (now - tonumber(ARGV[2])) .. ' d' .. epoch .. ' ' .. addr)
return 1
`)

// membersScript lists the leases as ID, address, ms since it lapsed (0
// while it stands; "dropped" for one its instance ended), and removes
// those lapsed longer than ARGV[1] ms.
var membersScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local exp, dropped, addr = string.match(all[i + 1], '^(%d+) (d?)%d+ (.*)$')
  exp = tonumber(exp)
  if exp and now - exp <= tonumber(ARGV[1]) then
    out[#out + 1] = all[i]
    out[#out + 1] = addr
    local lapsed = '0'
    if dropped == 'd' then lapsed = 'dropped'
    elseif exp <= now then lapsed = tostring(math.max(1, now - exp)) end
    out[#out + 1] = lapsed
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
`)

// RenewLease keeps instance id's lease (stateengine.Abilities.RenewLease).
func (r *Engine) RenewLease(ctx context.Context, id, addr string, life time.Duration) (stateengine.Renewal, error) {
	v, err := renewLeaseScript.Run(ctx, r.client, []string{r.KeyPrefix + membersKey}, id, addr,
		life.Milliseconds(), membersLife.Milliseconds()).Slice()
	if err != nil {
		return stateengine.Renewal{}, err
	}
	if len(v) != 3 {
		return stateengine.Renewal{}, fmt.Errorf("redis: a lease renewal answered %v", v)
	}
	epoch, _ := v[0].(int64)
	existed, _ := v[1].(int64)
	holder, _ := v[2].(string)
	return stateengine.Renewal{Epoch: uint64(epoch), Existed: existed == 1, Holder: holder}, nil
}

// DropLease ends instance id's lease as lapsed long enough ago for its
// sessions to be taken over at once (stateengine.Abilities.DropLease).
func (r *Engine) DropLease(ctx context.Context, id string, lapsed time.Duration) error {
	return dropLeaseScript.Run(ctx, r.client, []string{r.KeyPrefix + membersKey}, id, lapsed.Milliseconds()).Err()
}

// Members lists the leases (stateengine.Abilities.Members).
func (r *Engine) Members(ctx context.Context) (map[string]stateengine.Lease, error) {
	fields, err := membersScript.Run(ctx, r.client, []string{r.KeyPrefix + membersKey}, membersLife.Milliseconds()).StringSlice()
	if err != nil {
		return nil, err
	}
	m := make(map[string]stateengine.Lease, len(fields)/3)
	for i := 0; i+2 < len(fields); i += 3 {
		if fields[i+2] == "dropped" {
			m[fields[i]] = stateengine.Lease{Addr: fields[i+1], Lapsed: time.Millisecond, Dropped: true}
			continue
		}
		ms, _ := strconv.ParseInt(fields[i+2], 10, 64)
		m[fields[i]] = stateengine.Lease{Addr: fields[i+1], Lapsed: time.Duration(ms) * time.Millisecond}
	}
	return m, nil
}

// updateScript applies one update to an existing record, atomically, so
// that updates from several instances never regress it: fields only move
// towards open, and a missing record stays missing. KEYS[1] the record;
// ARGV: op (ended, opened, touch), ttl (ms). An open record lives ttl
// from now; an initializing one only ever gets longer, never shorter than
// the life Created gave it (up to its init deadline): the same expiry as
// serializer.RecordTTL's, without the deadline, which this call lacks.
var updateScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == 'opened' then
  redis.call('HSET', KEYS[1], 'open', '1', 'inflight', '0')
elseif ARGV[1] == 'ended' then
  redis.call('HSET', KEYS[1], 'inflight', '0')
end
if redis.call('HGET', KEYS[1], 'open') == '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
end
return 1
`)

// Created writes the record of a new session. The adapter sends the
// writes in batches (Writes); one on its own is a batch of one.
func (r *Engine) Created(ctx context.Context, key string, initDeadline time.Time, ttl time.Duration) error {
	return r.write(ctx, &stateengine.Write{Op: stateengine.OpCreated, Key: key, Deadline: initDeadline}, ttl)
}

// InitializeEnded clears the record's in-flight mark.
func (r *Engine) InitializeEnded(ctx context.Context, key string, ttl time.Duration) error {
	return r.write(ctx, &stateengine.Write{Op: stateengine.OpInitializeEnded, Key: key}, ttl)
}

// Opened marks the record open.
func (r *Engine) Opened(ctx context.Context, key string, ttl time.Duration) error {
	return r.write(ctx, &stateengine.Write{Op: stateengine.OpOpened, Key: key}, ttl)
}

// Touch refreshes the record's expiry.
func (r *Engine) Touch(ctx context.Context, key string, ttl time.Duration) error {
	return r.write(ctx, &stateengine.Write{Op: stateengine.OpTouch, Key: key}, ttl)
}

// Forget removes the record.
func (r *Engine) Forget(ctx context.Context, key string) error {
	return r.write(ctx, &stateengine.Write{Op: stateengine.OpForget, Key: key}, 0)
}

// Lookup reads the record.
func (r *Engine) Lookup(ctx context.Context, key string) (serializer.Record, bool, error) {
	vals, err := r.client.HMGet(ctx, r.KeyPrefix+key, "open", "deadline", "inflight", "owner").Result()
	if err != nil {
		return serializer.Record{}, false, err
	}
	open, deadline, inflight := vals[0], vals[1], vals[2]
	owner, _ := vals[3].(string)
	if open == nil {
		return serializer.Record{}, false, nil
	}
	ms, err := strconv.ParseInt(fmt.Sprint(deadline), 10, 64)
	if err != nil {
		return serializer.Record{}, false, errors.New("malformed record: deadline is not a number")
	}
	return serializer.Record{
		Open:               open == "1",
		InitDeadline:       time.UnixMilli(ms),
		InitializeInFlight: inflight == "1",
		Owner:              owner,
	}, true, nil
}

// UnmarshalCaddyfile sets up the engine from the tokens that follow
// `state` in an mcp_serializer block. Syntax:
//
//	redis [<address>...] {
//	    address                  <host:port>...
//	    cluster
//	    sentinel                 <host:port>...
//	    master_name              <name>
//	    sentinel_username        <name>
//	    sentinel_password        <password>
//	    username                 <name>
//	    password                 <password>
//	    db                       <number>
//	    tls                      [on|off]
//	    tls_server_name          <name>
//	    tls_insecure_skip_verify
//	    tls_ca_file              <path>
//	    tls_cert_file            <path>
//	    tls_key_file             <path>
//	    key_prefix               <prefix>
//	    timeout                  <duration>
//	}
//
// Every setting is optional and given once; defaults are applied in
// Provision, which refuses settings that cannot go together.
func (r *Engine) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // engine name
	r.Address = append(r.Address, d.RemainingArgs()...)
	seen := settings.Seen{}
	tlsOff := false
	for d.NextBlock(0) {
		setting := d.Val()
		if err := seen.Once(d, setting); err != nil {
			return err
		}
		var err error
		switch setting {
		case "address", "sentinel":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			if setting == "address" {
				r.Address = append(r.Address, args...)
			} else {
				r.Sentinel = args
			}
			continue
		case "tls":
			r.TLS = true
			if d.NextArg() {
				r.TLS, err = parseOnOff(d.Val())
				tlsOff = err == nil && !r.TLS
			}
		case "tls_insecure_skip_verify":
			r.TLSInsecureSkipVerify = true
		case "cluster":
			r.Cluster = true
		default:
			if !d.NextArg() {
				return d.ArgErr()
			}
			val := d.Val()
			switch text, ok := r.textSettings()[setting]; {
			case ok:
				*text = val
			case setting == "db":
				r.DB, err = strconv.Atoi(val)
			case setting == "timeout":
				r.Timeout, err = settings.Duration(val)
			default:
				return d.Errf("unrecognized redis state setting %q", setting)
			}
		}
		if err := settings.End(d, setting, err); err != nil {
			return err
		}
	}
	if tlsOff {
		for _, s := range []string{"tls_server_name", "tls_insecure_skip_verify", "tls_ca_file", "tls_cert_file", "tls_key_file"} {
			if seen[s] {
				return d.Errf("tls off beside %s, which needs TLS", s)
			}
		}
	}
	return nil
}

// textSettings are the settings whose value is kept as written.
func (r *Engine) textSettings() map[string]*string {
	return map[string]*string{
		"username": &r.Username, "password": &r.Password, "master_name": &r.MasterName,
		"sentinel_username": &r.SentinelUsername, "sentinel_password": &r.SentinelPassword,
		"tls_server_name": &r.TLSServerName, "tls_ca_file": &r.TLSCAFile,
		"tls_cert_file": &r.TLSCertFile, "tls_key_file": &r.TLSKeyFile, "key_prefix": &r.KeyPrefix,
	}
}

func parseOnOff(s string) (bool, error) {
	switch s {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("want on or off, got %q", s)
}

// Interface guards
var (
	_ stateengine.Engine    = (*Engine)(nil)
	_ caddy.Provisioner     = (*Engine)(nil)
	_ caddy.Validator       = (*Engine)(nil)
	_ caddy.CleanerUpper    = (*Engine)(nil)
	_ caddyfile.Unmarshaler = (*Engine)(nil)
	_ caddy.Destructor      = pooledRedis{}
)
