package main

import (
	"context"
	"fmt"
	"io"

	"github.com/flashgate/flashgate/mysql"
)

// runMigrate is `flashgate migrate up | status`: the schema step an operator
// takes before starting backends that do not migrate by themselves
// (mysql.auto_migrate off).
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newCommand("migrate", "up | status", stderr)
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "up" && pos[0] != "status") {
		return c.usageError("migrate takes one of: up, status")
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	if pos[0] == "up" {
		if err := mysql.Migrate(ctx, db); err != nil {
			return err
		}
	}
	ms, err := mysql.MigrationStatus(ctx, db)
	if err != nil {
		return err
	}
	for _, m := range ms {
		state := "pending"
		if m.Applied {
			state = "applied " + m.AppliedAt.UTC().Format("2006-01-02 15:04:05")
		}
		fmt.Fprintf(stdout, "%04d  %-32s %s\n", m.Version, m.Name, state)
	}
	// status answers whether the schema is fit to run on, not only what is
	// applied: a dirty or newer-than-known schema fails it.
	return mysql.CheckSchema(ctx, db)
}
