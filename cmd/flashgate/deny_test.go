package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestDenyUsage: deny add and remove take exactly one of --user and --jti,
// and add one of --for and --until; a wrong invocation is exit status 2 with
// the usage, before any call to the admin API.
func TestDenyUsage(t *testing.T) {
	for _, args := range [][]string{
		{"deny"},
		{"deny", "add"},
		{"deny", "add", "--user", "u", "--jti", "j"},
		{"deny", "add", "--user", "u", "--for", "1h", "--until", "2030-01-01T00:00:00Z"},
		{"deny", "add", "--user", "u", "--until", "tomorrow"},
		{"deny", "remove"},
		{"deny", "list", "extra"},
		{"deny", "nosuch"},
	} {
		var out, errb bytes.Buffer
		err := run(args, &out, &errb)
		var code exitCode
		if !errors.As(err, &code) || code != 2 {
			t.Errorf("%v: %v, want exit status 2", args, err)
		}
		if !strings.Contains(errb.String(), "usage: flashgate deny") {
			t.Errorf("%v: no usage in %q", args, errb.String())
		}
	}
}
