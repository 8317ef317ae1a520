// Command flashgate is the one binary of flashgate: the gateway and backend
// processes, and the operator's and tester's tools around them — tokens, the
// admin API's sale commands, a load bench that audits the invariants of
// docs/design.md §2 afterwards, and the demo `make demo` runs.
//
// main only wires: flags and configuration in, the packages named for each
// job do the work. The benchmark harnesses are not commands of the product:
// they are programs of their own under bench/ (docs/bench-tools.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/flashgate/flashgate/config"
)

const defaultConfigFile = "configs/flashgate.yaml"

const usage = `flashgate: a flash-sale edge (see docs/design.md)

usage: flashgate <command> [flags]

processes
  gateway                    run the gateway (public API on :8080, admin on :8081)
  backend                    run the backend (order consumers, admin API on :8082)

tools
  token --user ID            print an HS256 token for a user (FLASHGATE_JWT_SECRET)
  payment sign --order ID ...  print a payment body and its Flashgate-Signature (FLASHGATE_PAYMENTS_SECRET)
  sale create --id ID ...    create a sale through the admin API
  sale list                  the newest sales, one line each
  sale show ID               print a sale's ledger
  sale update ID --total N   change a live sale's window, total or limits (refused if it breaks counts taken)
  sale pause ID              purchases answer 503 paused and reserve nothing, until resumed
  sale resume ID             sell again
  sale close ID              stop selling now
  sale reconcile ID          repair and report a sale's ledger
  sale audit ID              check a sale's invariants (exit 3 if one is broken)
  sale export ID --format F  every order of a sale as csv or json, streamed
  order show ID              one order as MySQL has it
  order list --sale S        a sale's orders page by page (--user U: one buyer's)
  order cancel ID --reason R an operator cancels an order for its buyer; its units go back on sale
  audit-log [--sale S]       who changed what through the admin API, before and after
  dlq list [--sale S]        the dead-letter stream's orders and why they failed
  dlq redrive SEQ            republish a dead-lettered order once its cause is fixed
  deny add --user U | --jti J  revoke a buyer's tokens or one token on every gateway within a second
  deny remove | list         lift a denylist entry | the entries in force
  migrate up | status        apply the pending schema migrations | list them, applied or pending
  roles render KIND --secrets F  each role's Redis ACL, NATS users or MySQL grants (docs/credentials.md)
  bench --sale ID ...        fire purchase requests, then audit the invariants
  demo                       create a sale and bench it (what 'make demo' runs)
  version                    the module version, commit and Go version of this binary
  help                       this text

Every command takes --config PATH (default ` + defaultConfigFile + ` if it exists)
and honours the FLASHGATE_* environment. 'flashgate <command> --help' lists its flags.
`

// exitCode ends the program with a status and no further message: the
// command has already said why.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	var code exitCode
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, &code):
		os.Exit(int(code))
	default:
		fmt.Fprintf(os.Stderr, "flashgate: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitCode(2)
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "gateway", "backend":
		return serve(cmd, args, stderr)
	case "token":
		return tokenCmd(args, stdout, stderr)
	case "payment":
		return paymentCmd(args, stdout, stderr)
	case "sale":
		return saleCmd(args, stdout, stderr)
	case "dlq":
		return dlqCmd(args, stdout, stderr)
	case "deny":
		return denyCmd(args, stdout, stderr)
	case "order":
		return orderCmd(args, stdout, stderr)
	case "audit-log":
		return auditLogCmd(args, stdout, stderr)
	case "migrate":
		return runMigrate(context.Background(), args, stdout, stderr)
	case "roles":
		return rolesCmd(args, stdout, stderr)
	case "bench":
		return benchCmd(args, stdout, stderr)
	case "demo":
		return demoCmd(args, stdout, stderr)
	case "version", "--version":
		return versionCmd(args, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "flashgate: unknown command %q\n\n%s", cmd, usage)
	return exitCode(2)
}

// command is one subcommand's flag set with the --config flag every command has.
type command struct {
	*flag.FlagSet
	configPath string
}

func newCommand(name, synopsis string, stderr io.Writer) *command {
	c := &command{FlagSet: flag.NewFlagSet("flashgate "+name, flag.ContinueOnError)}
	c.SetOutput(stderr)
	def := ""
	if _, err := os.Stat(defaultConfigFile); err == nil {
		def = defaultConfigFile
	}
	c.StringVar(&c.configPath, "config", def, "YAML configuration `file` (FLASHGATE_* env overrides it)")
	c.Usage = func() {
		fmt.Fprintf(c.Output(), "usage: flashgate %s %s\n\n", name, synopsis)
		c.PrintDefaults()
	}
	return c
}

// parse reads flags and positional arguments in any order
// (`sale show ID --config x` as well as `sale show --config x ID`).
func (c *command) parse(args []string) ([]string, error) {
	var pos []string
	for {
		if err := c.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, exitCode(2) // flag has printed the error and the usage
		}
		args = c.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// config loads the configuration file and the environment.
func (c *command) config() (config.Config, error) {
	return config.Load(c.configPath)
}

// usageError reports a wrong invocation with the command's usage.
func (c *command) usageError(format string, a ...any) error {
	fmt.Fprintf(c.Output(), "flashgate: "+format+"\n\n", a...)
	c.Usage()
	return exitCode(2)
}

// mapFlag is a repeatable NAME=N flag (--region bj=400).
type mapFlag map[string]int64

func (m mapFlag) String() string {
	parts := make([]string, 0, len(m))
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	return strings.Join(parts, ",")
}

func (m mapFlag) Set(s string) error {
	name, val, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return errors.New("want NAME=UNITS")
	}
	var n int64
	if _, err := fmt.Sscan(val, &n); err != nil {
		return fmt.Errorf("units of %s: %w", name, err)
	}
	if _, dup := m[name]; dup {
		return fmt.Errorf("region %s given twice", name)
	}
	m[name] = n
	return nil
}
