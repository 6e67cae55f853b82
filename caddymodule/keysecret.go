package caddymodule

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
)

// Instances that hash key values with different secrets find different
// queues for one key: each claims its own, and one user's requests run on
// two instances at once. So each instance keeps a fingerprint of its
// secret in the state engine, as the owner of one record per table name,
// and says so, in a WARN and a metric, when the one recorded differs.
// It does not refuse keyed requests: which fingerprint came first says
// nothing of which is wrong, and an owner that refused the keys it holds
// would fail its peers' requests for them until its claims lapse.

// keySecretRecord, then the table's name, is the id of the record whose
// owner is the fingerprint of the instances' key secret. No session id or
// key can equal it: it holds spaces.
const keySecretRecord = "mcp_serializer key_secret fingerprint"

// How the fingerprint is kept: each instance renews it every
// keySecretEvery; once every instance of a fingerprint has stopped, it
// lapses keySecretLife later, and the next fingerprint may take its place.
const (
	keySecretEvery = 5 * time.Second
	keySecretLife  = 30 * time.Second
)

// keySecretCheck keeps this config's fingerprint in the engine and
// whether it differs from the one recorded.
type keySecretCheck struct {
	record      string
	fingerprint string
	store       owner.Claimer
	differs     atomic.Bool
	stop        chan struct{}
	stopped     sync.WaitGroup
	warns       warnlimit.Limiter
	logger      *zap.Logger
}

// keySecretFingerprint names secret without revealing it: an HMAC under
// it of a fixed message ("none" for no secret: a plain hash).
func keySecretFingerprint(secret []byte) string {
	if secret == nil {
		return "key_secret none"
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(keySecretRecord))
	return "key_secret " + hex.EncodeToString(mac.Sum(nil))[:16]
}

// startKeySecretCheck checks the fingerprint once now and then every
// keySecretEvery until stop.
func startKeySecretCheck(table string, secret []byte, store owner.Claimer, logger *zap.Logger) *keySecretCheck {
	c := &keySecretCheck{record: keySecretRecord + " " + table, fingerprint: keySecretFingerprint(secret), store: store, stop: make(chan struct{}), logger: logger}
	keySecretChecks.Store(c, struct{}{})
	c.check()
	c.stopped.Go(func() {
		tick := time.NewTicker(keySecretEvery)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
				c.check()
			}
		}
	})
	return c
}

// check claims the record for this fingerprint, or learns the one it
// names. An engine that does not answer changes nothing: what was learned
// last holds.
func (c *keySecretCheck) check() {
	ctx, cancel := context.WithTimeout(context.Background(), keySecretEvery)
	defer cancel()
	recorded, err := c.store.Claim(ctx, c.record, c.fingerprint, keySecretLife)
	if err != nil {
		return
	}
	differs := recorded != c.fingerprint
	c.differs.Store(differs)
	if differs {
		if ok, suppressed := c.warns.Allow(time.Now()); ok {
			c.logger.Warn("key_secret: the instances sharing this table and state do not hash key values with the same secret "+
				"(another fingerprint is recorded), so one key's requests can run on two instances at once; "+
				"set the same key_secret on every instance",
				zap.Int("suppressed", suppressed))
		}
	}
}

// halt stops the checks.
func (c *keySecretCheck) halt() {
	if c == nil {
		return
	}
	close(c.stop)
	c.stopped.Wait()
	keySecretChecks.Delete(c)
}

// keySecretChecks are the running checks, for the metric.
var keySecretChecks sync.Map

// keySecretsDiffering counts the running checks that see another
// fingerprint recorded, at scrape time.
func keySecretsDiffering() float64 {
	n := 0
	keySecretChecks.Range(func(k, _ any) bool {
		if k.(*keySecretCheck).differs.Load() {
			n++
		}
		return true
	})
	return float64(n)
}
