package testenv

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// NATSCluster is a JetStream cluster of the test's own: every node a real
// nats-server on free loopback ports, routed to the others, which the test
// may kill and start again.
type NATSCluster struct {
	Nodes []*Server
	// mon are the nodes' monitoring ports, names their server names.
	mon   []int
	names []string
}

// StartNATSCluster starts n nats-servers with JetStream, routed into one
// cluster, and waits until every node reports healthy (a JetStream meta
// leader elected, the node current).
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	c := &NATSCluster{}
	routes := make([]string, n)
	rports := make([]int, n)
	for i := range n {
		rports[i] = FreePort(t)
		routes[i] = "nats://127.0.0.1:" + strconv.Itoa(rports[i])
	}
	cluster := ID("fgc")
	var conf string
	if u := NATSUser(); u != "" {
		conf = filepath.Join(t.TempDir(), "nats.conf")
		body := fmt.Sprintf("authorization { users = [ { user: %q, password: %q } ] }\nno_auth_user: %q\n", u, NATSPassword(), u)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		port, mon := FreePort(t), FreePort(t)
		name := cluster + "-n" + strconv.Itoa(i+1)
		var others []string
		for j, r := range routes {
			if j != i {
				others = append(others, r)
			}
		}
		s := &Server{t: t, bin: "nats-server", Addr: "127.0.0.1:" + strconv.Itoa(port), args: []string{
			"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(mon), "-js", "-sd", t.TempDir(),
			"-n", name, "--cluster_name", cluster, "--cluster", routes[i], "--routes", strings.Join(others, ",")}}
		if conf != "" {
			s.args = append(s.args, "-c", conf)
		}
		t.Cleanup(s.Kill)
		// A lone node is not healthy before it has a quorum: the first start
		// waits for its port only, the cluster's health is awaited below.
		s.Start()
		s.ready = func() error { return natsHealthy(mon) }
		c.Nodes, c.mon, c.names = append(c.Nodes, s), append(c.mon, mon), append(c.names, name)
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := range c.Nodes {
		for {
			err := natsHealthy(c.mon[i])
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("nats cluster node %s not healthy: %v", c.names[i], err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

func natsHealthy(mon int) error {
	cl := http.Client{Timeout: time.Second}
	res, err := cl.Get("http://127.0.0.1:" + strconv.Itoa(mon) + "/healthz")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		return fmt.Errorf("healthz: %s", res.Status)
	}
	return nil
}

// URL is every node's URL, comma separated (what nats.url takes).
func (c *NATSCluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		urls[i] = s.URL()
	}
	return strings.Join(urls, ",")
}

// StreamLeader is the node that leads stream's replicas now (as the running
// nodes' monitoring endpoints report it), or nil.
func (c *NATSCluster) StreamLeader(stream string) *Server {
	cl := http.Client{Timeout: 2 * time.Second}
	for i, s := range c.Nodes {
		if s.cmd == nil || s.cmd.ProcessState != nil {
			continue
		}
		res, err := cl.Get("http://127.0.0.1:" + strconv.Itoa(c.mon[i]) + "/jsz?streams=true")
		if err != nil {
			continue
		}
		var jsz struct {
			Accounts []struct {
				Streams []struct {
					Name    string `json:"name"`
					Cluster struct {
						Leader string `json:"leader"`
					} `json:"cluster"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		}
		err = json.NewDecoder(res.Body).Decode(&jsz)
		res.Body.Close()
		if err != nil {
			continue
		}
		for _, a := range jsz.Accounts {
			for _, st := range a.Streams {
				if st.Name != stream || st.Cluster.Leader == "" {
					continue
				}
				for j, n := range c.names {
					if n == st.Cluster.Leader {
						return c.Nodes[j]
					}
				}
			}
		}
	}
	return nil
}

// RedisCluster is a Redis Cluster of the test's own: masters with a replica
// each, every node a real redis-server (no persistence) that the test may
// kill and start again; a restarted node keeps its nodes.conf and rejoins.
type RedisCluster struct {
	Nodes []*Server
}

// StartRedisCluster starts masters×(1+replicas) cluster-enabled redis-servers
// with a short cluster-node-timeout (nodeTimeout: how long a master may be
// silent before its replica takes over), joins them with redis-cli --cluster
// create, and waits until every node sees the cluster ok and every master has
// its replicas. Each node's cluster bus port is a free port of its own
// (cluster-port), not port+10000, which could be an ephemeral port.
//
// The create and the wait for the cluster to settle have deadlines
// (ClusterCreateTimeout, clusterSettleTimeout); past one, the attempt's
// nodes are killed and the cluster is made again on fresh ports, up to
// clusterAttempts times: a cluster that does not join (a port taken between
// FreePort and the bind, a bus that cannot connect) costs a minute, not the
// run.
func StartRedisCluster(t testing.TB, masters, replicas int, nodeTimeout time.Duration) *RedisCluster {
	t.Helper()
	var errs []string
	for attempt := 1; attempt <= clusterAttempts; attempt++ {
		c, err := startRedisCluster(t, masters, replicas, nodeTimeout, clusterCreateTimeout, clusterSettleTimeout, clusterPrepare)
		if err == nil {
			return c
		}
		errs = append(errs, fmt.Sprintf("attempt %d: %v", attempt, err))
		t.Logf("redis cluster: attempt %d of %d failed, trying again on fresh ports: %v", attempt, clusterAttempts, err)
	}
	t.Fatalf("redis cluster not made in %d attempts:\n%s", clusterAttempts, strings.Join(errs, "\n"))
	return nil
}

const (
	clusterAttempts      = 3
	clusterSettleTimeout = 30 * time.Second
)

// clusterCreateTimeout is ClusterCreateTimeout (this package's tests
// shorten it).
var clusterCreateTimeout = ClusterCreateTimeout

// clusterPrepare, when set (by this package's tests), runs on each attempt's
// nodes before the create: a test breaks an attempt with it.
var clusterPrepare func(attempt []*Server)

// startRedisCluster is one attempt of StartRedisCluster: on failure its
// nodes are killed (and the error says why).
func startRedisCluster(t testing.TB, masters, replicas int, nodeTimeout, createTimeout, settleTimeout time.Duration, prepare func([]*Server)) (_ *RedisCluster, err error) {
	t.Helper()
	c := &RedisCluster{}
	defer func() {
		if err != nil {
			for _, s := range c.Nodes {
				s.Kill()
			}
		}
	}()
	var addrs []string
	for range masters * (1 + replicas) {
		port, bus := FreePort(t), FreePort(t)
		dir := t.TempDir()
		s := &Server{t: t, bin: "redis-server", Addr: "127.0.0.1:" + strconv.Itoa(port), args: []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--enable-debug-command", "local",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10)}}
		if u := RedisUsername(); u != "" {
			s.args = append(s.args, "--user", u, "on", ">"+RedisPassword(), "~*", "&*", "+@all")
		}
		t.Cleanup(s.Kill)
		s.Start()
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	if prepare != nil {
		prepare(c.Nodes)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := redisCLI(createTimeout, args...)
	if out, err := cmd.CombinedOutput(); cmd.Done(err) != nil {
		return nil, fmt.Errorf("redis-cli --cluster create (within %v): %w\n%s", createTimeout, cmd.Done(err), tail(out, 10))
	}
	deadline := time.Now().Add(settleTimeout)
	for !c.settled(masters, replicas) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("redis cluster %v not ok with %d replicas per master within %v", addrs, replicas, settleTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c, nil
}

// tail is the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Addrs are every node's address (seeds for a client).
func (c *RedisCluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		a[i] = s.Addr
	}
	return a
}

// cli runs redis-cli against s (bounded by CLITimeout) and returns its
// output.
func cli(s *Server, args ...string) (string, error) {
	host, port, _ := strings.Cut(s.Addr, ":")
	cmd := redisCLI(CLITimeout, append([]string{"-h", host, "-p", port}, args...)...)
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), cmd.Done(err)
}

// redisCLI is redis-cli logged in as the servers of this package are set up:
// as RedisUsername when there is one, else as nobody. REDISCLI_AUTH (which
// var/secrets.env exports for the stack's own servers) is left out of its
// environment: redis-cli would send it as the default user's password to a
// server that has none. It is killed past d; call Done once it is over.
func redisCLI(d time.Duration, args ...string) *Timed {
	if u := RedisUsername(); u != "" {
		args = append([]string{"--user", u, "--pass", RedisPassword(), "--no-auth-warning"}, args...)
	}
	cmd := command(d, "redis-cli", args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDISCLI_AUTH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

func (c *RedisCluster) settled(masters, replicas int) bool {
	ms := 0
	for _, s := range c.Nodes {
		info, err := cli(s, "cluster", "info")
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return false
		}
		repl, err := cli(s, "info", "replication")
		if err != nil {
			return false
		}
		if strings.Contains(repl, "role:master") {
			ms++
			if !strings.Contains(repl, "connected_slaves:"+strconv.Itoa(replicas)) {
				return false
			}
		} else if !strings.Contains(repl, "master_link_status:up") {
			return false
		}
	}
	return ms == masters
}

// Settled reports whether the cluster is whole again: every running node
// sees it ok, masters many masters, each with replicas replicas in sync.
func (c *RedisCluster) Settled(masters, replicas int) bool { return c.settled(masters, replicas) }

// MasterOf is the node that serves key's slot as master now, as the running
// nodes see it.
func (c *RedisCluster) MasterOf(key string) *Server {
	c.Nodes[0].t.Helper()
	for _, s := range c.Nodes {
		if s.cmd == nil || s.cmd.ProcessState != nil {
			continue
		}
		slotS, err := cli(s, "cluster", "keyslot", key)
		if err != nil {
			continue
		}
		slot, err := strconv.Atoi(slotS)
		if err != nil {
			continue
		}
		nodes, err := cli(s, "cluster", "nodes")
		if err != nil {
			continue
		}
		// <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot ranges...>
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
				continue
			}
			addr, _, _ := strings.Cut(f[1], "@")
			for _, r := range f[8:] {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				a, err1 := strconv.Atoi(lo)
				b, err2 := strconv.Atoi(hi)
				if err1 != nil || err2 != nil || slot < a || slot > b {
					continue
				}
				for _, n := range c.Nodes {
					if n.Addr == addr {
						return n
					}
				}
			}
		}
	}
	return nil
}

// Cli runs redis-cli against node s of the cluster (logged in as the
// cluster's nodes are set up) and returns its output.
func (c *RedisCluster) Cli(s *Server, args ...string) (string, error) { return cli(s, args...) }

// Masters are the running nodes that are masters now.
func (c *RedisCluster) Masters() []*Server {
	var ms []*Server
	for _, s := range c.Nodes {
		if s.cmd == nil || s.cmd.ProcessState != nil {
			continue
		}
		if repl, err := cli(s, "info", "replication"); err == nil && strings.Contains(repl, "role:master") {
			ms = append(ms, s)
		}
	}
	return ms
}

// ReplicasOf are the running nodes that replicate m now.
func (c *RedisCluster) ReplicasOf(m *Server) []*Server {
	_, port, _ := strings.Cut(m.Addr, ":")
	var rs []*Server
	for _, s := range c.Nodes {
		if s == m || s.cmd == nil || s.cmd.ProcessState != nil {
			continue
		}
		repl, err := cli(s, "info", "replication")
		if err == nil && strings.Contains(repl, "role:slave") && lineOf(repl, "master_port:") == "master_port:"+port {
			rs = append(rs, s)
		}
	}
	return rs
}

// lineOf is the line of text that starts with prefix ("" if none).
func lineOf(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
