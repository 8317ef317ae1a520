package chaos

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/redis/rueidis"
)

// shape is what every scenario's stack is made of. `make chaos` takes it from
// the environment, as `make up` does (docs/recovery.md "The suite on the
// fleet"): REDIS=cluster (3 masters, a replica each), NATS=cluster (3
// JetStream nodes, the streams at R3), GATEWAYS=n, BACKENDS=n. Unset, it is
// the suite's own small world: one Redis, one NATS, 2 gateways, 1 backend.
type shape struct {
	redisCluster, natsCluster bool
	gateways, backends        int
}

var fleet = shapeFromEnv()

func shapeFromEnv() shape {
	s := shape{redisCluster: os.Getenv("REDIS") == "cluster", natsCluster: os.Getenv("NATS") == "cluster", gateways: 2, backends: 1}
	// Scenarios act on gateway 1: at least two.
	if n, err := strconv.Atoi(os.Getenv("GATEWAYS")); err == nil && n > 2 {
		s.gateways = n
	}
	if n, err := strconv.Atoi(os.Getenv("BACKENDS")); err == nil && n > 1 {
		s.backends = n
	}
	return s
}

func (s shape) String() string {
	redis, nats := "1 Redis", "1 NATS"
	if s.redisCluster {
		redis = "Redis Cluster 3 masters + 1 replica each"
	}
	if s.natsCluster {
		nats = "NATS cluster of 3, streams at R3"
	}
	return fmt.Sprintf("%s, %s, %d gateways, %d backends", redis, nats, s.gateways, s.backends)
}

// everyGateway is env for each gateway of the shape.
func everyGateway(env []string) [][]string {
	out := make([][]string, fleet.gateways)
	for i := range out {
		out[i] = env
	}
	return out
}

// saleKey is a key of sale's own slot (all its keys share one hash tag).
func saleKey(sale string) string { return lua.KeysFor(sale, nil).Meta }

// redisOf is the Redis that holds sale: the standalone one, or on a Redis
// Cluster the master serving the sale's slot now.
func (st *stack) redisOf(sale string) *testenv.Server {
	st.t.Helper()
	if st.rcluster == nil {
		return st.redis
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := st.rcluster.MasterOf(saleKey(sale)); m != nil {
			return m
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("no master serves sale %s's slot", sale)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// holdShard keeps master's shard whole while the scenario acts on master: on
// a Redis Cluster its replicas are told not to take over
// (cluster-replica-no-failover), so that a master stopped stays the shard's
// one Redis (unreachable, not replaced), and a master restarted without data
// comes back as the empty master of its slots, its replica resyncing from it:
// the shard has lost its data, as a standalone Redis restarted without
// persistence. (Losing a master to its replica is "redis master failover".)
func (st *stack) holdShard(master *testenv.Server) {
	st.t.Helper()
	if st.rcluster == nil {
		return
	}
	for _, r := range st.rcluster.ReplicasOf(master) {
		if out, err := st.rcluster.Cli(r, "config", "set", "cluster-replica-no-failover", "yes"); err != nil || out != "OK" {
			st.t.Fatalf("config set cluster-replica-no-failover on %s: %v %s", r.Addr, err, out)
		}
	}
}

// loseRedis is the Redis holding sale killed with -9 and started again
// without its data after down (on a cluster: the sale's master, held).
func (st *stack) loseRedis(sale string, down time.Duration) {
	st.t.Helper()
	m := st.redisOf(sale)
	st.holdShard(m)
	st.t.Logf("killing the Redis of sale %s: %s", sale, m.Addr)
	m.Kill()
	time.Sleep(down)
	m.Start()
	st.redisBack()
}

// loseAllRedis is every Redis killed with -9 and started again without data
// (on a cluster: every master, each held).
func (st *stack) loseAllRedis(down time.Duration) {
	st.t.Helper()
	if st.rcluster == nil {
		st.redis.Kill()
		time.Sleep(down)
		st.redis.Start()
		return
	}
	ms := st.rcluster.Masters()
	for _, m := range ms {
		st.holdShard(m)
	}
	for _, m := range ms {
		m.Kill()
	}
	time.Sleep(down)
	for _, m := range ms {
		m.Start()
	}
	st.redisBack()
}

// redisBack waits, on a cluster, until it is whole again (every node sees it
// ok, every master has its replica in sync): a restarted standalone Redis is
// back once it accepts connections, a cluster once it serves every slot
// (before, it answers CLUSTERDOWN, and a gateway starting then stops).
func (st *stack) redisBack() {
	st.t.Helper()
	if st.rcluster == nil {
		return // a standalone Redis: Start waited for it to accept connections
	}
	deadline := time.Now().Add(30 * time.Second)
	for !st.rcluster.Settled(3, 1) {
		if time.Now().After(deadline) {
			st.t.Fatalf("the Redis Cluster is not whole again within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// flushRedis empties every Redis (on a cluster every master: FLUSHALL is per
// node).
func (st *stack) flushRedis(rc rueidis.Client) error {
	if st.rcluster == nil {
		return rc.Do(context.Background(), rc.B().Flushall().Build()).Error()
	}
	for _, m := range st.rcluster.Masters() {
		if out, err := st.rcluster.Cli(m, "flushall"); err != nil || out != "OK" {
			return fmt.Errorf("FLUSHALL on %s: %v %s", m.Addr, err, out)
		}
	}
	return nil
}

// natsOf is the NATS node that holds the orders stream: the standalone one,
// or on a cluster the node leading the stream now.
func (st *stack) natsOf() *testenv.Server {
	st.t.Helper()
	if st.ncluster == nil {
		return st.nats
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if l := st.ncluster.StreamLeader(st.cfg.NATS.Stream); l != nil {
			st.t.Logf("the leader of %s: %s", st.cfg.NATS.Stream, l.Addr)
			return l
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("no leader of stream %s", st.cfg.NATS.Stream)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leader is the backend holding the leader lock (waiting, bounded, for one
// to hold it); with one backend, that one. It becomes st.backend, the one
// the admin calls and the conservation gauge go to.
func (st *stack) leader() *proc {
	st.t.Helper()
	if len(st.backends) == 1 {
		return st.backends[0]
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p := st.leaderNow(); p != nil {
			return p
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("no backend of %d holds the leader lock", len(st.backends))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leaderNow is the backend whose flashgate_backend_leader reads 1 now (nil
// if none); found, it becomes st.backend.
func (st *stack) leaderNow() *proc {
	if len(st.backends) == 1 {
		return st.backends[0]
	}
	for _, p := range st.backends {
		if !p.running() {
			continue
		}
		if v, ok, err := scrapeSample(p.admin, "flashgate_backend_leader"); err == nil && ok && v == 1 {
			st.backend = p
			return p
		}
	}
	return nil
}

// running reports whether the process is started and not ended.
func (p *proc) running() bool { return p.cmd != nil && p.cmd.ProcessState == nil }
