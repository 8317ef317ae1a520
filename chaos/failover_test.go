package chaos

import (
	"strconv"
	"testing"
	"time"
)

// The scenarios of a node's loss in a replicated deployment (docs/recovery.md
// "Losing one node"): the NATS node leading the orders stream, and the Redis
// master holding the sale, each killed with -9 mid-flood.
func init() {
	scenarios = append(scenarios,
		scenario{"nats node kill -9", natsNodeKill},
		scenario{"redis master failover", func(t *testing.T) { redisMasterFailover(t, 0) }},
		scenario{"redis master failover, wait 1", func(t *testing.T) { redisMasterFailover(t, 1) }},
	)
}

// natsNodeKill: three JetStream nodes, the streams at R3. The node leading
// the orders stream is killed mid-flood and brought back 2 s later: the
// others elect a new leader, gateways and the backend reconnect to a live
// seed, and every 202 becomes an order.
func natsNodeKill(t *testing.T) {
	st := newStackWith(t, stackOpts{natsCluster: true})
	s := st.createSale(3000, 1)
	requests, accepted := st.flood(s.ID, 4000, 4000, func() {
		leader := st.ncluster.StreamLeader(st.cfg.NATS.Stream)
		if leader == nil {
			t.Fatalf("no leader of stream %s", st.cfg.NATS.Stream)
		}
		t.Logf("killing the leader of %s: %s", st.cfg.NATS.Stream, leader.Addr)
		leader.Kill()
		time.Sleep(2 * time.Second)
		leader.Start()
	})
	if len(accepted) == 0 {
		t.Fatalf("nothing accepted")
	}
	rep, rec := st.settle(s.ID, accepted)
	record(t, "nats node kill -9", requests, accepted, rep, rec)
}

// redisMasterFailover: a Redis Cluster of three masters with a replica each.
// The master of the sale's slot is killed with -9 mid-flood; its replica
// takes over after cluster-node-timeout, and the gateways find it by
// themselves (rueidis refreshes its slot map on the connection errors and
// MOVED answers). A second flood of new buyers after the failover must be
// admitted: that is the proof the admissions resumed. The killed node comes
// back as the new master's replica before that flood.
//
// waitReplicas 0: replication is asynchronous, and admissions the master
// acknowledged but had not sent to its replica are lost from Redis; their
// orders are in JetStream, so MySQL writes them, and the units they took are
// sold a second time from Redis: MySQL's guard fails the excess orders
// (units returned), never oversells. Those failed orders are the row's own.
// waitReplicas 1: every admission waited for its replica before the 202;
// nothing acknowledged is lost: failed 0.
func redisMasterFailover(t *testing.T, waitReplicas int) {
	name := "redis master failover"
	var env []string
	if waitReplicas > 0 {
		name += ", wait " + strconv.Itoa(waitReplicas)
		env = append(env, "FLASHGATE_REDIS_WAIT_REPLICAS="+strconv.Itoa(waitReplicas))
	}
	st := newStackWith(t, stackOpts{redisCluster: true, env: env})
	// 3,000 units, 1 per buyer. The first flood is 1,500 buyers asking 8
	// times each: every ask runs the admission on the master, so the flood
	// lasts across the kill, and it cannot sell the sale out; the second,
	// 3,000 new buyers, does, so a unit the failover un-sold in Redis meets
	// MySQL's guard (and a buyer admitted twice, their count lost with it,
	// meets the per-user guard).
	s := st.createSale(3000, 1)
	tag := "{s:" + s.ID + "}"
	requests, accepted := st.flood(s.ID, 1500, 12000, func() {
		m := st.rcluster.MasterOf(tag)
		if m == nil {
			t.Fatalf("no master for %s", tag)
		}
		t.Logf("killing the master of %s: %s", tag, m.Addr)
		m.Kill()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if n := st.rcluster.MasterOf(tag); n != nil && n != m {
				t.Logf("%s's replica %s took over", tag, n.Addr)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no replica took over %s within 30s", tag)
			}
			time.Sleep(100 * time.Millisecond)
		}
		m.Start()
		// Back as the new master's replica (with wait_replicas, the shard
		// admits nothing until it has one again).
		for !st.rcluster.Settled(3, 1) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not rejoin as a replica within 30s", m.Addr)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// New buyers after the failover: admitted by the new master.
	more, acceptedAfter := st.flood(s.ID, 3000, 3000, nil)
	if len(acceptedAfter) == 0 {
		t.Errorf("no admission after the failover: the gateways did not find the new master")
	}
	t.Logf("accepted during the flood with the failover %d, after it %d", len(accepted), len(acceptedAfter))
	accepted = append(accepted, acceptedAfter...)
	requests += more
	// Without wait_replicas a 202 the failover lost from Redis may end
	// failed: the row's measured price, not an anomaly.
	st.allow.FailedAccepted = waitReplicas == 0
	rep, rec := st.settle(s.ID, accepted)
	recordRow(t, row{name: name, requests: requests, accepted: int64(len(accepted)), orders: rep.Orders,
		oversold: rep.Oversold, overLimit: rep.OverLimitUsers, lost: rep.Lost, duplicated: rep.Duplicated,
		ledgerDiff: rep.LedgerDiff, recovery: rec, excused: waitReplicas == 0}, rep)
}
