package gateway

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"testing"
)

// TestMain keeps the gateway's logs out of test and benchmark output unless -v.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(emfileChildEnv) != "" {
		os.Exit(emfileChild())
	}
	if !testing.Verbose() {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	os.Exit(m.Run())
}
