package backend

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
)

// parseRedisNode reads INFO's run id and role; serversMoved calls a change
// what may have lost writes: a new process or role at an address, a new
// address; a first look, or a node that left, is none.
func TestServersMoved(t *testing.T) {
	n := parseRedisNode("# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n\r\n# Replication\r\nrole:master\r\nconnected_slaves:1\r\n")
	if n != (redisNode{runID: "abc", role: "master"}) {
		t.Fatalf("parsed %+v", n)
	}
	a := map[string]redisNode{"x:1": {"r1", "master"}, "x:2": {"r2", "slave"}}
	for _, c := range []struct {
		name   string
		before map[string]redisNode
		now    map[string]redisNode
		want   []string
	}{
		{"first look", nil, a, nil},
		{"same", a, map[string]redisNode{"x:1": {"r1", "master"}, "x:2": {"r2", "slave"}}, nil},
		{"restarted", a, map[string]redisNode{"x:1": {"r9", "master"}, "x:2": {"r2", "slave"}}, []string{"x:1"}},
		{"promoted", a, map[string]redisNode{"x:1": {"r1", "slave"}, "x:2": {"r2", "master"}}, []string{"x:1", "x:2"}},
		{"a new address", a, map[string]redisNode{"x:2": {"r2", "master"}, "x:3": {"r3", "master"}}, []string{"x:2", "x:3"}},
		{"one left", a, map[string]redisNode{"x:1": {"r1", "master"}}, nil},
	} {
		if got := serversMoved(c.before, c.now); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestRebuildAfterRedisChangesHands: a Redis that comes back as another
// process with the sale's books still in it (here a restart from its
// append-only file; in production a replica promoted by a failover, which
// may lack the writes after the last WAIT) leaves the sale warm, so nothing
// asks for a warm; the leader sees the new run id and rebuilds the sale
// (its epoch moves), and the invariants hold.
func TestRebuildAfterRedisChangesHands(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir()}
	if u := testenv.RedisUsername(); u != "" {
		args = append(args, "--user", u, "on", ">"+testenv.RedisPassword(), "~*", "&*", "+@all")
	}
	srv := testenv.NewServer(t, "redis-server", "127.0.0.1:"+strconv.Itoa(port), args...)
	srv.Start()
	t.Cleanup(srv.Kill)
	s := start(t, []string{srv.Addr}, nil)
	sale := spec(10, 1, nil)
	k := s.createSale(sale)
	o := admit(t, s.rc, k, "u1", 1, "")
	s.publish(o)
	eventually(t, 15*time.Second, "the order written", func() bool { return s.rows(sale.ID, "confirmed") == 1 })
	epoch := s.queryInt(`SELECT epoch FROM sales WHERE id = ?`, sale.ID)
	// The leader has looked at who serves Redis at least once.
	time.Sleep(reconcileEvery + time.Second)
	srv.Kill()
	srv.Start()
	if n, err := s.rc.Do(ctx(t), s.rc.B().Exists().Key(k.Meta).Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("the sale is not warm after the restart (%d, %v): the test needs the append-only file", n, err)
	}
	eventually(t, 3*reconcileEvery+20*time.Second, "the sale rebuilt", func() bool {
		return s.queryInt(`SELECT epoch FROM sales WHERE id = ?`, sale.ID) > epoch
	})
	if r := check(t, s.env, sale.ID, []uint64{o.ID}); !r.OK() || r.Sold != 1 {
		t.Errorf("invariants after the rebuild: %s", r)
	}
}
