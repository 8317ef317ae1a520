package testenv

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"
)

// A command past its deadline is killed and says so.
func TestCommandHasADeadline(t *testing.T) {
	cmd := command(200*time.Millisecond, "sleep", "60")
	err := cmd.Done(cmd.Run())
	var exit *exec.ExitError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &exit) || exit.Exited() {
		t.Fatalf("sleep 60 under a 200 ms deadline: %v, want it killed past the deadline", err)
	}
	ok := command(10*time.Second, "true")
	if err := ok.Done(ok.Run()); err != nil {
		t.Errorf("true within its deadline: %v", err)
	}
}

// A cluster whose create hangs (a node stopped: redis-cli waits for its
// answer forever) fails within the create's deadline, with its nodes gone.
func TestClusterCreateTimesOut(t *testing.T) {
	var nodes []*Server
	_, err := startRedisCluster(t, 3, 0, time.Second, 3*time.Second, 10*time.Second, func(n []*Server) {
		nodes = n
		n[0].Pause()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("create with a stopped node: %v, want the deadline exceeded", err)
	}
	for _, s := range nodes {
		if s.cmd.ProcessState == nil {
			t.Errorf("node %s of the failed attempt still runs", s.Addr)
		}
	}
}

// StartRedisCluster makes the cluster again on fresh ports after an attempt
// that hung.
func TestClusterRetriesOnFreshPorts(t *testing.T) {
	var attempts [][]string
	clusterPrepare = func(n []*Server) {
		var addrs []string
		for _, s := range n {
			addrs = append(addrs, s.Addr)
		}
		attempts = append(attempts, addrs)
		if len(attempts) == 1 {
			n[0].Pause()
		}
	}
	defer func() { clusterPrepare = nil }()
	clusterCreateTimeout = 3 * time.Second
	defer func() { clusterCreateTimeout = ClusterCreateTimeout }()
	c := StartRedisCluster(t, 3, 0, time.Second)
	if len(attempts) != 2 {
		t.Fatalf("%d attempts, want 2 (the first hung)", len(attempts))
	}
	for _, a := range attempts[1] {
		for _, b := range attempts[0] {
			if a == b {
				t.Errorf("the second attempt reused %s", a)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rc := Redis(t, c.Addrs())
	if err := rc.Do(ctx, rc.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatalf("the second attempt's cluster does not serve: %v", err)
	}
}
