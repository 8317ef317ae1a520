package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docCommand is a command line the documents give: `flashgate X …` or bin/flashgate X ….
var docCommand = regexp.MustCompile("(?:`|bin/)flashgate ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")

// TestDocsNameOnlyRealCommands: every `flashgate <command>` the README and docs/
// tell someone to run is a command of this binary (its usage lists it), and
// so is the subcommand of `flashgate sale` and `flashgate migrate`.
func TestDocsNameOnlyRealCommands(t *testing.T) {
	commands := map[string]map[string]bool{}
	for _, line := range strings.Split(usage, "\n") {
		if !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   ") {
			continue
		}
		f := strings.Fields(line)
		if commands[f[0]] == nil {
			commands[f[0]] = map[string]bool{}
		}
		// "sale create --id …", "migrate up | status": the words that are subcommands.
		for _, w := range f[1:] {
			if w == "|" {
				continue
			}
			if strings.HasPrefix(w, "-") || strings.ToUpper(w) == w {
				break
			}
			commands[f[0]][w] = true
		}
	}
	for _, c := range []string{"gateway", "backend", "sale", "migrate", "token"} {
		if commands[c] == nil {
			t.Fatalf("usage lists no %q command: the test no longer reads it right (%v)", c, commands)
		}
	}
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range docCommand.FindAllStringSubmatch(line, -1) {
				n++
				subs, ok := commands[m[1]]
				switch {
				case !ok:
					t.Errorf("%s:%d names `flashgate %s`, which is not a command (flashgate help)", f, i+1, m[1])
				case (m[1] == "sale" || m[1] == "migrate") && m[2] != "" && !subs[m[2]]:
					t.Errorf("%s:%d names `flashgate %s %s`, which is not a command (flashgate help)", f, i+1, m[1], m[2])
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("found only %d command lines in the docs: has the test stopped reading them?", n)
	}
}
