package serializer

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// StoreKey is what a Store keys a session's record by: the hex SHA-256 of
// its id, since the id itself is a bearer credential.
func StoreKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// SessionHash is what logs and the admin endpoint name a session by: the
// first 12 hex digits of the SHA-256 of its id, enough to tell sessions
// apart, never the id itself.
func SessionHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:6])
}

// RecordTTL is how long a session's record lives after a write at now:
// ttl (SessionTTL), and a record not yet open at least until initDeadline,
// so that another instance still gates the session until its init_timeout
// runs out even when SessionTTL is shorter.
func RecordTTL(ttl time.Duration, open bool, initDeadline, now time.Time) time.Duration {
	if left := initDeadline.Sub(now); !open && left > ttl {
		return left
	}
	return ttl
}
