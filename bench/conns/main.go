// Command flashgate-bench-conns opens N keep-alive connections to a gateway,
// has each answered once, holds them idle and reads the gateway's resident
// memory from /proc: the rss_10k figure of scripts/bench.sh
// (bench/README.md). It must run on the gateway's machine.
//
//	go build -o bin/flashgate-bench-conns ./bench/conns
//	bin/flashgate-bench-conns --pid-file var/run/gateway.pid --conns 10000
package main

import "github.com/flashgate/flashgate/bench/internal/cli"

const programName = "flashgate-bench-conns"

func main() { cli.Main(programName, run) }
