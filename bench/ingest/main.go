// Command flashgate-bench-ingest times a flashgate backend writing a stream
// pre-filled with N orders into MySQL, then audits the sale: the
// backend_ingest figure of scripts/bench.sh (bench/README.md). It runs the
// backend as a process of its own, from the flashgate binary, with a private
// database, stream and admin port on the shared servers, and removes them
// afterwards.
//
//	go build -o bin/flashgate-bench-ingest ./bench/ingest
//	bin/flashgate-bench-ingest --orders 50000 --json var/bench/backend_ingest.json
package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/flashgate/flashgate/bench/internal/cli"
)

const programName = "flashgate-bench-ingest"

func main() { cli.Main(programName, run) }

// findFlashgate finds the binary the backend runs from: the flashgate built
// beside this program (bin/ holds both), else the one on the PATH.
func findFlashgate() (string, error) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "flashgate")
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath("flashgate"); err == nil {
		return p, nil
	}
	return "", errors.New("no flashgate binary beside this program or on the PATH")
}
