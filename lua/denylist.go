package lua

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Denylist is a hash of the revoked token subjects and ids (auth.Denylist):
// field "sub:<user>" or "jti:<token id>" → the unix second the entry lapses,
// and field DenylistVersion, a counter every change raises. A gateway reads
// the counter every denylistPoll and the whole hash only when it moved
// (LoadDenylist), so a change reaches every gateway within a poll however
// long the list is, and an unchanged list costs one HGET.
const Denylist = keyPrefix + "denylist"

// DenylistVersion is the hash's change counter field (not an entry: it has no colon).
const DenylistVersion = "v"

// Deny adds or extends an entry (auth.DenyEntry) until a time. The entry is
// written before the counter moves: a gateway that reads the new counter
// reads the entry with it.
func Deny(ctx context.Context, rc rueidis.Client, entry string, until time.Time) error {
	for _, r := range rc.DoMulti(ctx,
		rc.B().Hset().Key(Denylist).FieldValue().FieldValue(entry, strconv.FormatInt(until.Unix(), 10)).Build(),
		rc.B().Hincrby().Key(Denylist).Field(DenylistVersion).Increment(1).Build(),
	) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// Undeny removes entries; it answers how many there were.
func Undeny(ctx context.Context, rc rueidis.Client, entries ...string) (int64, error) {
	n, err := rc.Do(ctx, rc.B().Hdel().Key(Denylist).Field(entries...).Build()).AsInt64()
	if err != nil || n == 0 {
		return n, err
	}
	return n, rc.Do(ctx, rc.B().Hincrby().Key(Denylist).Field(DenylistVersion).Increment(1).Build()).Error()
}

// DenylistVersionOf is the change counter now (0: never changed).
func DenylistVersionOf(ctx context.Context, rc rueidis.Client) (int64, error) {
	v, err := rc.Do(ctx, rc.B().Hget().Key(Denylist).Field(DenylistVersion).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return v, err
}

// LoadDenylist is every entry (name → lapse, unix seconds) and the counter
// they go with.
func LoadDenylist(ctx context.Context, rc rueidis.Client) (map[string]int64, int64, error) {
	all, err := rc.Do(ctx, rc.B().Hgetall().Key(Denylist).Build()).AsStrMap()
	if err != nil {
		return nil, 0, err
	}
	out := make(map[string]int64, len(all))
	var ver int64
	for k, s := range all {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			continue
		}
		if k == DenylistVersion {
			ver = n
			continue
		}
		out[k] = n
	}
	return out, ver, nil
}
