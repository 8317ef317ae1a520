package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/roles"
)

// rolesCmd is `flashgate roles render KIND --secrets FILE`: the servers' users
// and permissions of package roles, with the passwords of FILE, for
// scripts/stack.sh (which writes them into var/secrets/) and for a
// deployment's provisioning.
//
//	redis-acl   the ACL file every Redis node loads (aclfile)
//	nats-users  the users = [ … ] list of a NATS server's authorization block
//	mysql-sql   the SQL that makes the MySQL accounts and their grants
//
// FILE holds lines S_<SERVER>_<ROLE>=<password> (var/secrets/generated.env):
// S_REDIS_GATEWAY, S_NATS_BACKEND, S_MYSQL_MIGRATOR, …
func rolesCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("roles", "render redis-acl | nats-users | mysql-sql --secrets FILE", stderr)
	secrets := c.String("secrets", "", "`file` of S_<SERVER>_<ROLE>=<password> lines")
	setinfo := c.Bool("redis-setinfo", false, "the Redis servers know CLIENT SETINFO (7.2+)")
	host := c.String("mysql-host", "127.0.0.1", "the `host` the MySQL accounts log in from")
	var extra, gateways multiFlag
	c.Var(&extra, "mysql-extra", "a database `pattern` the admin, migrator and backend also get their rights on (repeatable)")
	c.Var(&gateways, "gateway", "a gateway Redis `user=from-to` and the order-id nodes it leases (repeatable; none: one user, flashgate_gateway, every node); its password is S_REDIS_<USER without flashgate_>")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 2 || pos[0] != "render" {
		return c.usageError("roles render takes one of: redis-acl, nats-users, mysql-sql")
	}
	if *secrets == "" {
		return c.usageError("--secrets is required")
	}
	vars, err := readSecretsFile(*secrets)
	if err != nil {
		return err
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	switch pos[1] {
	case "redis-acl":
		o := roles.RedisOptions{SetInfo: *setinfo}
		pw := roles.StackPasswords(vars, "REDIS")
		for _, g := range gateways {
			name, r, _ := strings.Cut(g, "=")
			from, to, ok, err := config.Gateway{NodeIDs: r}.NodeRange()
			if err != nil || !ok || name == "" {
				return c.usageError(fmt.Sprintf("--gateway %q: want user=from-to", g))
			}
			o.Gateways = append(o.Gateways, roles.GatewayUser{Name: name, From: from, To: to})
			if v := vars["S_REDIS_"+strings.ToUpper(strings.TrimPrefix(name, "flashgate_"))]; v != "" {
				pw[name] = v
			}
		}
		return roles.RenderRedisACL(stdout, o, pw)
	case "nats-users":
		return roles.RenderNATSUsers(stdout, cfg, roles.StackPasswords(vars, "NATS"))
	case "mysql-sql":
		db := "flashgate"
		if i := strings.LastIndexByte(cfg.MySQL.DSN, '/'); i >= 0 {
			db, _, _ = strings.Cut(cfg.MySQL.DSN[i+1:], "?")
		}
		return roles.RenderMySQL(stdout, roles.MySQLOptions{Database: db, Extra: extra}, *host, roles.StackPasswords(vars, "MYSQL"))
	}
	return c.usageError("roles render takes one of: redis-acl, nats-users, mysql-sql")
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// readSecretsFile reads NAME=VALUE lines (VALUE bare, single-quoted, or as
// bash's printf %q writes it).
func readSecretsFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			continue
		}
		switch {
		case len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'':
			v = strings.ReplaceAll(v[1:len(v)-1], `'\''`, `'`)
		case strings.HasPrefix(v, "$'"):
			if u, err := strconv.Unquote(`"` + strings.TrimSuffix(v[2:], "'") + `"`); err == nil {
				v = u
			}
		default:
			var b strings.Builder
			for i := 0; i < len(v); i++ {
				if v[i] == '\\' && i+1 < len(v) {
					i++
				}
				b.WriteByte(v[i])
			}
			v = b.String()
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
