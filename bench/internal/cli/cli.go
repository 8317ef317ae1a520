// Package cli is what the bench programs (bench/ingest, bench/conns) share
// on their command line: a flag set with --config, flags and arguments in any
// order, usage errors and exit statuses (results go out through loadgen.WriteJSON). The product
// binary, cmd/flashgate, has its own; these programs are not part of it.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/flashgate/flashgate/config"
)

// DefaultConfigFile is read when it exists and no --config is given, so that
// the programs run from the repository's root pick up the stack's settings.
const DefaultConfigFile = "configs/flashgate.yaml"

// DefaultTarget is the gateway's public address in the default configuration.
const DefaultTarget = "http://127.0.0.1:8080"

// ExitCode ends the program with a status and no further message: the
// command has already said why.
type ExitCode int

func (e ExitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Main runs a program's run function and exits as it says: 0, the status of
// an ExitCode, or 1 after printing any other error prefixed with name.
func Main(name string, run func(args []string, stdout, stderr io.Writer) error) {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	var code ExitCode
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, &code):
		os.Exit(int(code))
	default:
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Command is a program's flag set with the --config flag every program has.
type Command struct {
	*flag.FlagSet
	name       string
	ConfigPath string
}

// NewCommand makes the flag set of program name; synopsis follows the name
// in the usage line.
func NewCommand(name, synopsis string, stderr io.Writer) *Command {
	c := &Command{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), name: name}
	c.SetOutput(stderr)
	def := ""
	if _, err := os.Stat(DefaultConfigFile); err == nil {
		def = DefaultConfigFile
	}
	c.StringVar(&c.ConfigPath, "config", def, "YAML configuration `file` (FLASHGATE_* env overrides it)")
	c.Usage = func() {
		fmt.Fprintf(c.Output(), "usage: %s %s\n\n", name, synopsis)
		c.PrintDefaults()
	}
	return c
}

// ParseAll reads flags and positional arguments in any order and returns the
// positional ones. A wrong flag has been reported with the usage and comes
// back as ExitCode(2).
func (c *Command) ParseAll(args []string) ([]string, error) {
	var pos []string
	for {
		if err := c.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, ExitCode(2) // flag has printed the error and the usage
		}
		args = c.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// Config loads the configuration file and the environment.
func (c *Command) Config() (config.Config, error) {
	return config.Load(c.ConfigPath)
}

// UsageError reports a wrong invocation with the program's usage.
func (c *Command) UsageError(format string, a ...any) error {
	fmt.Fprintf(c.Output(), c.name+": "+format+"\n\n", a...)
	c.Usage()
	return ExitCode(2)
}
