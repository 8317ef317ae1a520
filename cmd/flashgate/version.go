package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// commit is the build's commit when the build has no VCS information (a
// build outside the git checkout, or with -buildvcs=false):
// go build -ldflags "-X main.commit=$(git rev-parse HEAD)". make build sets it
// and version.
// version, likewise, is `git describe` of the build when the module has no
// version of its own (a local build is "(devel)").
var commit, version string

// buildInfo is what `flashgate version` prints: the module's version, the
// commit it was built from (and whether the tree had changes), the Go version.
type buildInfo struct {
	Version, Commit, Go string
	Modified            bool
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: "(devel)", Commit: commit, Go: runtime.Version()}
	if version != "" {
		b.Version = version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		b.Version = v
	} else if version != "" {
		b.Version = version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

func versionCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("version", "", stderr)
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return c.usageError("unexpected arguments %q", pos)
	}
	b := readBuildInfo()
	commit := b.Commit
	switch {
	case commit == "":
		commit = "unknown (built without VCS information or -ldflags -X main.commit)"
	case b.Modified:
		commit += " (modified)"
	}
	fmt.Fprintf(stdout, "flashgate %s\ncommit %s\n%s %s/%s\n", b.Version, commit, b.Go, runtime.GOOS, runtime.GOARCH)
	return nil
}
