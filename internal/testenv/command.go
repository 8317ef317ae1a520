package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"time"
)

// Every command a harness runs and waits for has a deadline: a tool that
// hangs (redis-cli --cluster create once waited 15 minutes for a cluster
// that would not join, until the test binary's own limit) must cost the
// test seconds and a clear failure, never the run.
const (
	// CLITimeout bounds one redis-cli call (a query of one node).
	CLITimeout = 10 * time.Second
	// ClusterCreateTimeout bounds redis-cli --cluster create, which takes a
	// few seconds when the nodes can meet.
	ClusterCreateTimeout = 60 * time.Second
	// InstallTimeout bounds a data directory's creation (mariadb-install-db)
	// and a configuration's rendering.
	InstallTimeout = 2 * time.Minute
)

// Timed is a command under a deadline.
type Timed struct {
	*exec.Cmd
	ctx    context.Context
	cancel context.CancelFunc
}

// command is exec.CommandContext under a deadline of d; call Done once the
// command is over. A command past its deadline is killed, and its pipes are
// closed a second later at the latest (WaitDelay), so that a child holding
// them cannot keep Wait waiting.
func command(d time.Duration, name string, args ...string) *Timed {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = time.Second
	return &Timed{Cmd: cmd, ctx: ctx, cancel: cancel}
}

// Command is command for harnesses outside this package (the chaos suite's
// build): exec.CommandContext with a deadline of d.
func Command(d time.Duration, name string, args ...string) *Timed { return command(d, name, args...) }

// Done releases the deadline's timer and says whether the deadline passed:
// err (the command's error) wrapped with context.DeadlineExceeded if so.
func (c *Timed) Done(err error) error {
	defer c.cancel()
	if err != nil && c.ctx.Err() != nil {
		return fmt.Errorf("%w: %w", c.ctx.Err(), err)
	}
	return err
}
