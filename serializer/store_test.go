package serializer

import (
	"testing"
	"time"
)

func TestStoreKeyIsTheHexSHA256OfTheID(t *testing.T) {
	// FIPS 180-2's test vector for "abc".
	const want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := StoreKey("abc"); got != want {
		t.Fatalf("StoreKey(abc) = %s, want %s", got, want)
	}
	if StoreKey("abc") == StoreKey("abd") {
		t.Fatal("two ids share a key")
	}
}

func TestRecordTTLKeepsAnInitializingRecordUntilItsDeadline(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	const ttl = time.Minute
	for _, tc := range []struct {
		name     string
		open     bool
		deadline time.Time
		want     time.Duration
	}{
		{"initializing, deadline beyond ttl", false, now.Add(time.Hour), time.Hour},
		{"initializing, deadline within ttl", false, now.Add(time.Second), ttl},
		{"initializing, deadline passed", false, now.Add(-time.Hour), ttl},
		{"initializing, no deadline", false, time.Time{}, ttl},
		{"open, deadline beyond ttl", true, now.Add(time.Hour), ttl},
		{"open, no deadline", true, time.Time{}, ttl},
	} {
		if got := RecordTTL(ttl, tc.open, tc.deadline, now); got != tc.want {
			t.Errorf("%s: RecordTTL = %s, want %s", tc.name, got, tc.want)
		}
	}
}
