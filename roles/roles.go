// Package roles says, once, what each of flashgate's processes may do on each
// server: the Redis ACL users, the NATS users and their permissions, the MySQL
// users and their grants (docs/credentials.md). scripts/stack.sh renders the
// local stack's files from it (`flashgate roles render`), the tests' private
// servers are started with the same rendering, and a deployment's provisioning
// renders them for its own servers.
//
// The rule of each role is what its process needs and nothing more, and the
// servers enforce it: the gateway, on the internet-facing hosts, calls
// flashgate's Redis functions and cannot run Lua of its own or write a sale's
// meta, epoch or indexes; it reads no other role's NATS replies; it has no
// MySQL login at all. The backend runs DML and no DDL; the migrator, run by
// an operator before a deploy, changes the schema.
package roles

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/orderid"
)

// The users, one per role (the same name on every server that has it).
const (
	Admin    = "flashgate_admin"    // the operator, the CLI, the tests
	Gateway  = "flashgate_gateway"  // flashgate gateway
	Backend  = "flashgate_backend"  // flashgate backend
	Migrator = "flashgate_migrator" // flashgate migrate up (MySQL only)
	Replica  = "flashgate_replica"  // a Redis replica's login to its master
	Consumer = "flashgate_consumer" // the shop's downstream systems (NATS only)
	Route    = "flashgate_route"    // NATS cluster routes
)

// Passwords maps a user to its password (Redis, NATS) for one server kind.
type Passwords map[string]string

// ---------------------------------------------------------------------------
// Redis

// Redis commands by purpose. A function's commands are checked against its
// caller's rules (Redis functions do not raise privileges), so a role that
// calls a function must hold the commands the function runs, on the keys it
// runs them on: what keeps the gateway from a sale's meta is its key
// patterns, and what keeps it from any other Lua is that it has FCALL only.
var (
	redisConnect = []string{"+ping", "+hello", "+auth", "+client|setname", "+client|getname", "+client|id",
		"+client|tracking", "+client|caching", "+readonly", "+cluster|slots", "+cluster|shards", "+cluster|info", "+cluster|myid"}
	// redisCall: flashgate's functions (lua/library.go).
	redisCall = []string{"+fcall", "+fcall_ro"}
	// redisLoad: loading them, and checking they are there.
	redisLoad = []string{"+function|load", "+function|list"}
	// redisEval: rueidislock, the backend's leader lock, runs EVALSHA scripts
	// of its own (on flashgate:* only).
	redisEval = []string{"+evalsha", "+eval", "+evalsha_ro", "+eval_ro", "+script|load", "+script|exists"}
	// redisData: the commands flashgate and its functions send.
	redisData = []string{"+wait", "+time", "+get", "+set", "+del", "+exists", "+pttl", "+pexpire", "+pexpireat",
		"+mget", "+incrby", "+decrby", "+hget", "+hset", "+hsetnx", "+hdel", "+hexists", "+hgetall", "+hincrby",
		"+hmget", "+hvals", "+hkeys", "+hlen", "+sadd", "+srem", "+smembers", "+sismember", "+scard", "+zadd", "+zrem",
		"+zrange", "+zrangebyscore", "+zscore", "+zmscore", "+zcard"}
	// redisInstall: a rebuild installs its staged keys (backend only).
	redisInstall = []string{"+rename", "+persist"}
	// redisWatch: the leader reads who serves each node (run id, role) to
	// rebuild the sales after a failover (backend only).
	redisWatch = []string{"+info"}
)

// GatewayWrites are the key patterns the gateway may write
// (lua.GatewayWritePatterns: what its functions write); its order-id node
// leases are its range's (GatewayUser). It may not write a sale's meta
// (state, window, limits), its epoch (the rebuild's fence), its warm lock or
// restock set, nor the indexes of sales.
var GatewayWrites = lua.GatewayWritePatterns()

// GatewayUser is one gateway Redis user and the order-id nodes it may lease
// (gateway.node_ids): with one user per gateway host, each on a range of
// its own, no gateway's login can take another's node ids.
type GatewayUser struct {
	Name     string
	From, To int
}

// RedisUser is one ACL user: its rules, without its password.
type RedisUser struct {
	Name  string
	Rules []string
}

// RedisOptions are what the rendering depends on besides the roles.
type RedisOptions struct {
	// SetInfo: the server knows CLIENT SETINFO (Redis 7.2+), which the
	// client library sends (and tolerates a refusal of).
	SetInfo bool
	// Gateways are the gateway users; none: one, Gateway, leasing every node.
	Gateways []GatewayUser
}

// AllNodes is the last order-id node the gateways lease (the degraded
// lane's, above it, are leased in MySQL).
const AllNodes = orderid.LeasedNodes - 1

// RedisUsers are the ACL users of every Redis node. default has a password
// given to nobody: a client that does not log in gets NOAUTH. It is not
// switched off, because Redis 7.0 replays the append-only file as the default
// user and checks the MULTI blocks there against its rules.
func RedisUsers(o RedisOptions) []RedisUser {
	conn := redisConnect
	if o.SetInfo {
		conn = append(append([]string{}, conn...), "+client|setinfo")
	}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	gws := o.Gateways
	if len(gws) == 0 {
		gws = []GatewayUser{{Gateway, 0, AllNodes}}
	}
	users := []RedisUser{
		{"default", []string{"~*", "&*", "+@all"}},
		{Admin, []string{"~*", "&*", "+@all"}},
	}
	for _, g := range gws {
		keys := []string{"resetkeys", "%R~" + lua.AllKeysPattern}
		for _, p := range GatewayWrites {
			keys = append(keys, "%RW~"+p)
		}
		for _, p := range NumberGlobs(g.From, g.To) {
			keys = append(keys, "%RW~"+lua.NodeLeasePrefix+p)
		}
		users = append(users, RedisUser{g.Name, cat(keys, []string{"resetchannels", "-@all"}, conn, redisCall, redisData)})
	}
	return append(users, []RedisUser{
		{Backend, cat([]string{"resetkeys", "~" + lua.AllKeysPattern, "~" + lua.LeaderLockPattern, "resetchannels", "-@all"}, conn, redisCall, redisLoad, redisEval, redisData, redisInstall, redisWatch)},
		{Replica, []string{"resetkeys", "resetchannels", "-@all", "+ping", "+psync", "+sync", "+replconf", "+auth", "+hello"}},
	}...)
}

// NumberGlobs are glob patterns (as Redis ACL key patterns take them) that
// together match the decimal numbers from..to and no other: 0-1007 is [0-9],
// [1-9][0-9], [1-9][0-9][0-9], 100[0-7].
func NumberGlobs(from, to int) []string {
	var out []string
	for from <= to {
		// The numbers of from's length, up to to.
		top := 9
		for top < from {
			top = top*10 + 9
		}
		end := min(to, top)
		out = append(out, sameLength(strconv.Itoa(from), strconv.Itoa(end))...)
		from = end + 1
	}
	return out
}

// sameLength: globs for lo..hi, two numbers of one length.
func sameLength(lo, hi string) []string {
	if lo == hi {
		return []string{lo}
	}
	if len(lo) == 1 {
		return []string{"[" + lo + "-" + hi + "]"}
	}
	if lo[0] == hi[0] {
		var out []string
		for _, g := range sameLength(lo[1:], hi[1:]) {
			out = append(out, lo[:1]+g)
		}
		return out
	}
	rest := len(lo) - 1
	nines, zeros := strings.Repeat("9", rest), strings.Repeat("0", rest)
	any := strings.Repeat("[0-9]", rest)
	var out []string
	first, last := lo[0], hi[0]
	if lo[1:] != zeros {
		for _, g := range sameLength(lo[1:], nines) {
			out = append(out, lo[:1]+g)
		}
		first++
	}
	tail := []string(nil)
	if hi[1:] != nines {
		for _, g := range sameLength(zeros, hi[1:]) {
			tail = append(tail, hi[:1]+g)
		}
		last--
	}
	if first <= last {
		if first == last {
			out = append(out, string(first)+any)
		} else {
			out = append(out, "["+string(first)+"-"+string(last)+"]"+any)
		}
	}
	return append(out, tail...)
}

// RenderRedisACL writes the ACL file (aclfile) of the users with their
// passwords, stored hashed. A user without a password is not written.
func RenderRedisACL(w io.Writer, o RedisOptions, pw Passwords) error {
	for _, u := range RedisUsers(o) {
		p, ok := pw[u.Name]
		if !ok || p == "" {
			return fmt.Errorf("roles: no Redis password for %s", u.Name)
		}
		sum := sha256.Sum256([]byte(p))
		if _, err := fmt.Fprintf(w, "user %s on #%s %s\n", u.Name, hex.EncodeToString(sum[:]), strings.Join(u.Rules, " ")); err != nil {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// MySQL

// MySQLGrant is one GRANT of a user.
type MySQLGrant struct {
	Privileges []string
	On         string // `db`.* (backquoted, as GRANT takes it)
}

// MySQLUser is one MySQL account and its grants.
type MySQLUser struct {
	Name   string
	Grants []MySQLGrant
}

// MySQLOptions: the databases the grants are on.
type MySQLOptions struct {
	// Database is flashgate's (mysql.dsn).
	Database string
	// Extra are database patterns the admin, the migrator and the backend
	// get the same rights on (the local stack's tests make a database per
	// test: `fgtest\_%`).
	Extra []string
}

// The backend's rights: rows, no schema. SELECT … FOR UPDATE and GET_LOCK
// (leadership of the degraded lane, the migration lock it waits on while
// checking the schema) need nothing more.
var (
	mysqlDML = []string{"SELECT", "INSERT", "UPDATE", "DELETE"}
	mysqlDDL = []string{"SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "DROP", "INDEX", "REFERENCES"}
)

// MySQLUsers: admin (every right on flashgate's databases), migrator (the
// schema: `flashgate migrate up`), backend (rows only). The gateway has no
// MySQL account: it never reads MySQL (MySQLDropped).
func MySQLUsers(o MySQLOptions) []MySQLUser {
	on := func(privs []string, admin bool) []MySQLGrant {
		db := "`" + o.Database + "`.*"
		if admin {
			db = "`" + o.Database + "%`.*"
		}
		g := []MySQLGrant{{privs, db}}
		for _, e := range o.Extra {
			g = append(g, MySQLGrant{privs, "`" + e + "`.*"})
		}
		return g
	}
	return []MySQLUser{
		{Admin, on([]string{"ALL PRIVILEGES"}, true)},
		{Migrator, on(mysqlDDL, false)},
		{Backend, on(mysqlDML, false)},
	}
}

// MySQLDropped are accounts earlier versions created that no role has now.
var MySQLDropped = []string{Gateway}

// RenderMySQL writes the SQL that makes the accounts (host is where they
// log in from) with their passwords and exactly their grants: a right an
// earlier version granted is revoked first, and dropped accounts go.
func RenderMySQL(w io.Writer, o MySQLOptions, host string, pw Passwords) error {
	q := func(s string) string {
		return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
	}
	for _, d := range MySQLDropped {
		fmt.Fprintf(w, "DROP USER IF EXISTS %s@%s;\n", q(d), q(host))
	}
	for _, u := range MySQLUsers(o) {
		p, ok := pw[u.Name]
		if !ok || p == "" {
			return fmt.Errorf("roles: no MySQL password for %s", u.Name)
		}
		acct := q(u.Name) + "@" + q(host)
		fmt.Fprintf(w, "CREATE USER IF NOT EXISTS %s IDENTIFIED BY %s;\nALTER USER %s IDENTIFIED BY %s;\n", acct, q(p), acct, q(p))
		fmt.Fprintf(w, "REVOKE ALL PRIVILEGES, GRANT OPTION FROM %s;\n", acct)
		for _, g := range u.Grants {
			fmt.Fprintf(w, "GRANT %s ON %s TO %s;\n", strings.Join(g.Privileges, ", "), g.On, acct)
		}
	}
	_, err := fmt.Fprintln(w, "FLUSH PRIVILEGES;")
	return err
}

// ---------------------------------------------------------------------------
// NATS

// Inbox prefixes: a gateway's and a backend's replies (its requests'
// answers, its JetStream acks and pull deliveries) arrive under a prefix of
// its role's own (nats.inbox_prefix), and each may subscribe to its own
// only. A gateway's login thus reads no backend's deliveries (orders: buyers'
// data), and neither reads the other's answers. The consumer (the shop's
// systems, any NATS client) keeps the default _INBOX, which neither of the
// two uses.
const (
	GatewayInbox = "_INBOX_gateway"
	BackendInbox = "_INBOX_backend"
)

// InboxPrefix is the prefix role's processes use (nats.inbox_prefix); "" for
// a role that keeps the default _INBOX.
func InboxPrefix(role string) string {
	switch role {
	case Gateway:
		return GatewayInbox
	case Backend:
		return BackendInbox
	}
	return ""
}

// NATSUser is one NATS user's permissions (nil: everything).
type NATSUser struct {
	Name               string
	Publish, Subscribe []string
}

// NATSUsers are the users of every NATS server for the subjects and streams
// of c (nats.*, events.*): the permissions name them, so a deployment with
// other names renders its own.
func NATSUsers(c config.Config) []NATSUser {
	n, e := c.NATS, c.Events
	s, d := n.Stream, n.Stream+"_DLQ"
	es, ed := e.Stream, e.Stream+"_DLQ"
	cmd := n.CommandSubject
	js := func(parts ...string) []string {
		out := make([]string, len(parts))
		for i, p := range parts {
			out[i] = "$JS." + p
		}
		return out
	}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	return []NATSUser{
		{Name: Admin},
		{Name: Gateway,
			Publish: cat([]string{n.OrderSubject + ".*", n.EventSubject + ".hint.*", n.EventSubject + ".stats.*", cmd, cmd + ".purchase"},
				js("API.INFO", "API.STREAM.INFO."+s)),
			Subscribe: []string{n.EventSubject + ".>", cmd + ".reply.>", GatewayInbox + ".>"}},
		{Name: Backend,
			Publish: cat([]string{n.EventSubject + ".>", n.OrderSubject + ".*", n.OrderSubject + "_dlq.>", cmd + ".reply.>",
				e.Subject + ".*", e.Subject + "_dlq.>"},
				js("API.INFO",
					"API.STREAM.INFO."+es, "API.STREAM.CREATE."+es, "API.STREAM.UPDATE."+es,
					"API.STREAM.INFO."+ed, "API.STREAM.CREATE."+ed, "API.STREAM.UPDATE."+ed,
					"API.CONSUMER.CREATE."+es+".>", "API.CONSUMER.DURABLE.CREATE."+es+".>", "API.CONSUMER.INFO."+es+".>",
					"API.CONSUMER.MSG.NEXT."+es+".>", "ACK."+es+".>",
					"API.STREAM.INFO."+s, "API.STREAM.CREATE."+s, "API.STREAM.UPDATE."+s, "API.STREAM.MSG.GET."+s,
					"API.STREAM.INFO."+d, "API.STREAM.CREATE."+d, "API.STREAM.UPDATE."+d, "API.STREAM.MSG.GET."+d, "API.STREAM.MSG.DELETE."+d,
					"API.DIRECT.GET."+s, "API.DIRECT.GET."+s+".>", "API.DIRECT.GET."+d, "API.DIRECT.GET."+d+".>",
					"API.CONSUMER.CREATE."+s, "API.CONSUMER.CREATE."+s+".>", "API.CONSUMER.DURABLE.CREATE."+s+".>",
					"API.CONSUMER.INFO."+s+".>", "API.CONSUMER.MSG.NEXT."+s+".>", "ACK."+s+".>")),
			Subscribe: []string{n.EventSubject + ".>", cmd, cmd + ".purchase", BackendInbox + ".>"}},
		{Name: Consumer,
			Publish: js("API.INFO", "API.STREAM.INFO."+es, "API.STREAM.MSG.GET."+es,
				"API.DIRECT.GET."+es, "API.DIRECT.GET."+es+".>",
				"API.CONSUMER.CREATE."+es, "API.CONSUMER.CREATE."+es+".>", "API.CONSUMER.DURABLE.CREATE."+es+".>",
				"API.CONSUMER.INFO."+es+".>", "API.CONSUMER.DELETE."+es+".>", "API.CONSUMER.MSG.NEXT."+es+".>",
				"ACK."+es+".>"),
			Subscribe: []string{"_INBOX.>"}},
	}
}

// RenderNATSUsers writes the users = [ … ] list of a NATS server's
// authorization block, with the passwords.
func RenderNATSUsers(w io.Writer, c config.Config, pw Passwords) error {
	list := func(l []string) string {
		q := make([]string, len(l))
		for i, s := range l {
			q[i] = fmt.Sprintf("%q", s)
		}
		return strings.Join(q, ", ")
	}
	fmt.Fprintln(w, "users = [")
	for _, u := range NATSUsers(c) {
		p, ok := pw[u.Name]
		if !ok || p == "" {
			return fmt.Errorf("roles: no NATS password for %s", u.Name)
		}
		if u.Publish == nil && u.Subscribe == nil {
			fmt.Fprintf(w, "  { user: %q, password: %q }\n", u.Name, p)
			continue
		}
		fmt.Fprintf(w, "  { user: %q, password: %q, permissions: {\n    publish: { allow: [%s] }\n    subscribe: { allow: [%s] }\n  } }\n",
			u.Name, p, list(u.Publish), list(u.Subscribe))
	}
	_, err := fmt.Fprintln(w, "]")
	return err
}

// StackPasswords picks server's passwords ("REDIS", "NATS", "MYSQL") out of
// variables named S_<SERVER>_<ROLE> (scripts/stack.sh's generated.env:
// S_REDIS_GATEWAY, S_MYSQL_MIGRATOR, …).
func StackPasswords(vars map[string]string, server string) Passwords {
	pw := Passwords{}
	for _, u := range []string{"default", Admin, Gateway, Backend, Migrator, Replica, Consumer, Route} {
		suffix := strings.ToUpper(strings.TrimPrefix(u, "flashgate_"))
		if v := vars["S_"+server+"_"+suffix]; v != "" {
			pw[u] = v
		}
	}
	return pw
}
