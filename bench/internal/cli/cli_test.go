package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestCommand(t *testing.T) {
	var errOut bytes.Buffer
	c := NewCommand("flashgate-bench-x", "[--n N]", &errOut)
	n := c.Int("n", 1, "a number")
	pos, err := c.ParseAll([]string{"a", "--n", "3", "b", "--config", "x.yaml"})
	if err != nil || *n != 3 || c.ConfigPath != "x.yaml" || strings.Join(pos, ",") != "a,b" {
		t.Fatalf("pos %q n %d config %q: %v", pos, *n, c.ConfigPath, err)
	}
	var code ExitCode
	if _, err := c.ParseAll([]string{"--nope"}); !errors.As(err, &code) || code != 2 {
		t.Fatalf("unknown flag: %v", err)
	}
	errOut.Reset()
	if err := c.UsageError("bad %d", 7); !errors.As(err, &code) || code != 2 ||
		!strings.HasPrefix(errOut.String(), "flashgate-bench-x: bad 7\n\nusage: flashgate-bench-x [--n N]") {
		t.Fatalf("usage error: %v %q", err, errOut.String())
	}
}
