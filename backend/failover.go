package backend

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/redis/rueidis"
)

// A Redis master that fails over to a replica, or restarts from its
// append-only file, serves the sale's books as that replica or file had them:
// what came after the last write that waited for the replicas
// (redis.wait_replicas) is gone, the sale is still warm, and nothing else
// notices. A give-back of a purchase-limit hold, a confirm, a restock lost
// that way leaves Redis's counts off what MySQL decided until something
// rebuilds the sale (spec/admission.pml finds it: BUG_NO_FAILOVER_REBUILD).
// So the leader watches who serves Redis: every Redis node's run id and role
// (a new process has a new run id; a promoted replica changes role), and when
// any changed since its last look it rebuilds every recent sale, after the
// publish grace as for a sale Redis lost.

// redisNode is who serves one address: its process (run id) and role.
type redisNode struct{ runID, role string }

// redisNodes reads the run id and role of every node c knows.
func redisNodes(ctx context.Context, c rueidis.Client) (map[string]redisNode, error) {
	out := map[string]redisNode{}
	for addr, n := range c.Nodes() {
		info, err := n.Do(ctx, n.B().Info().Section("server").Section("replication").Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("redis %s: info: %w", addr, err)
		}
		out[addr] = parseRedisNode(info)
	}
	return out, nil
}

// parseRedisNode reads run_id and role from INFO's text.
func parseRedisNode(info string) redisNode {
	var n redisNode
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case !ok:
		case k == "run_id":
			n.runID = v
		case k == "role":
			n.role = v
		}
	}
	return n
}

// serversMoved reports whether now differs from before in a way that may
// have lost writes: a node that was there with another run id or role, or an
// address that was not there (a node that joined, a replica that took over).
// A node that left is no loss by itself (its slots went to one that is new or
// promoted). The first look (before nil) is no change.
func serversMoved(before, now map[string]redisNode) []string {
	if before == nil {
		return nil
	}
	var moved []string
	for _, addr := range slices.Sorted(maps.Keys(now)) {
		if b, ok := before[addr]; !ok || b != now[addr] {
			moved = append(moved, addr)
		}
	}
	return moved
}
