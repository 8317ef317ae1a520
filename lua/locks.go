package lua

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Tokens held in a key with a TTL: the order-id node leases (orderid) and the
// backend's warm locks. Their owner renews and frees them only while the key
// still holds its token, in one call each (functions of the library, so that
// a role without EVAL, the gateway, renews its lease).

var (
	renewScript  = newScript("renew", `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0`)
	unlockScript = newScript("unlock", `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	// probeScript writes a short-lived key in one hash tag: it fails as the
	// orders' functions would on a Redis that refuses them or writes.
	probeScript = newScript("probe", `redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1`)
)

// RenewLock sets key's TTL to ttl if key still holds token; false when it
// does not (gone, or someone else's).
func RenewLock(ctx context.Context, c rueidis.Client, key, token string, ttl time.Duration) (bool, error) {
	n, err := renewScript.Exec(ctx, c, []string{key}, []string{token, strconv.FormatInt(ttl.Milliseconds(), 10)}).AsInt64()
	return n == 1, err
}

// Unlock deletes key if it still holds token.
func Unlock(ctx context.Context, c rueidis.Client, key, token string) error {
	return unlockScript.Exec(ctx, c, []string{key}, []string{token}).Error()
}

// ProbeWrite writes key (value "1", expiring after ttl) through a function:
// nil when the master of key's slot runs the library's functions and writes.
func ProbeWrite(ctx context.Context, c rueidis.Client, key string, ttl time.Duration) error {
	return probeScript.Exec(ctx, c, []string{key}, []string{"1", strconv.FormatInt(ttl.Milliseconds(), 10)}).Error()
}
