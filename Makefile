# flashgate — see docs/design.md §10 for the local stack. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# Go lives in /usr/local/go on our machines, which is not on every PATH (CI, sudo, cron).
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
# Secrets: the stack generates them (and a login per role for Redis, NATS and MariaDB) into var/
# and writes the operator's set to var/secrets.env, which the targets below that need them source
# (`. var/secrets.env` does it for your shell). Set your own in the environment:
# `FLASHGATE_JWT_SECRET=… FLASHGATE_ADMIN_TOKEN=… make up` (docs/credentials.md).
SECRETS := var/secrets.env
# The stack runs in dev mode (a warning at start; docs/security.md): FLASHGATE_DEV=0 checks the
# secrets as production would. Generated secrets pass those checks either way.
export FLASHGATE_DEV ?= 1
GOFMT ?= gofmt
BIN := bin/flashgate
STACK := scripts/stack.sh

.PHONY: install help deps build bench-build up infra-up down status reset test demo saleday verify bench bench-go bench-edge hostile lint fmt clean fuzz vendor-ui vendor-ui-check

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-10s %s\n", $$1, $$2}'

deps: ## install missing Debian packages (redis, mariadb, nats, nginx, wrk, ...) and Go modules
	@GO=$(GO) $(STACK) deps

# The commit and version `flashgate version` prints when the build carries no VCS information.
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS := -X main.commit=$(COMMIT) -X main.version=$(VERSION) \
	-X github.com/flashgate/flashgate/metrics.StampedCommit=$(COMMIT) -X github.com/flashgate/flashgate/metrics.StampedVersion=$(VERSION)

build: deps ## build bin/flashgate
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/flashgate

# make install PREFIX=/opt/flashgate [DESTDIR=...] [SYSCONFDIR=...]: the binary (the Lua scripts,
# the migrations and the OpenAPI document are embedded in it), the configuration (kept if one is
# there), the systemd units with PREFIX written into their paths, the license and the docs.
PREFIX     ?= /usr/local
SYSCONFDIR ?= $(PREFIX)/etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
install: build ## install bin/flashgate, configs, systemd units and docs under PREFIX (default /usr/local)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SYSCONFDIR)/flashgate $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/doc/flashgate/docs
	install -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/flashgate
	test -e $(DESTDIR)$(SYSCONFDIR)/flashgate/flashgate.yaml || install -m 0644 configs/flashgate.yaml $(DESTDIR)$(SYSCONFDIR)/flashgate/flashgate.yaml
	for u in deploy/systemd/*.service; do \
		sed -e 's|/usr/local/etc|$(SYSCONFDIR)|g' -e 's|/usr/local|$(PREFIX)|g' $$u > $(DESTDIR)$(UNITDIR)/$$(basename $$u) && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$(basename $$u) || exit 1; \
	done
	install -m 0644 README.md LICENSE api/openapi.yaml $(DESTDIR)$(PREFIX)/share/doc/flashgate/
	install -m 0644 docs/*.md $(DESTDIR)$(PREFIX)/share/doc/flashgate/docs/

# The benchmark harnesses are programs of their own, not commands of the product (bench/README.md).
bench-build: deps ## build bin/flashgate-bench-ingest, bin/flashgate-bench-conns and bin/bench-report
	$(GO) build -o bin/flashgate-bench-ingest ./bench/ingest
	$(GO) build -o bin/flashgate-bench-conns ./bench/conns
	$(GO) build -o bin/bench-report ./bench/report

up: deps build ## start the whole local stack: infra, backend, gateway, nginx on :8000 (REDIS=cluster NATS=cluster GATEWAYS=3 BACKENDS=2: the fleet)
	@$(STACK) up

infra-up: deps ## start Redis (16379), Redis Cluster (17001-17003, replicas 17004-17006), NATS (14222), MariaDB (13306)
	@$(STACK) infra-up

down: ## stop everything the stack started (never the machine's own services)
	@$(STACK) down

status: ## one line per part of the stack: up/down
	@$(STACK) status

reset: ## stop the stack and delete its data (var/)
	@$(STACK) reset

# The infra is stopped afterwards whatever happened (quietly, into var/log/test-down.log, so that
# go test's summary stays the last thing printed); the exit code is the tests' (or infra-up's).
# This stops a stack started by `make up` too; KEEP_STACK=1 leaves everything running.
# The fault suite's scenarios (TestChaos: 21 of them, each a whole private stack flooded and
# faulted: 11 minutes on this machine) are `make chaos`'s, a target of their own like bench and fuzz; the
# chaos package's own tests (the harness's deadlines, the cluster create retry) run here.
test: deps ## start the infra, run go test -race (the chaos scenarios are make chaos), stop the infra
	@rc=0; \
	if $(STACK) infra-up; then \
		. $(SECRETS); $(GO) test -race -count=1 -skip '^TestChaos$$' ./... || rc=$$?; \
	else \
		rc=$$?; echo "make test: infra-up failed" >&2; \
	fi; \
	if [[ -z "$${KEEP_STACK:-}" ]]; then \
		mkdir -p var/log; \
		$(STACK) down > var/log/test-down.log 2>&1 || { echo "make test: stack down failed:" >&2; cat var/log/test-down.log >&2; }; \
	fi; \
	exit $$rc

# make demo fires at the first gateway of the stack (its STACK_PORT_OFFSET counted); DEMO_TARGET
# chooses another, e.g. nginx in front of a fleet (docs/recovery.md "The local stack's shapes").
DEMO_TARGET ?= http://127.0.0.1:$(shell echo $$((8080 + $${STACK_PORT_OFFSET:-0})))
# The last line make demo prints is the last line of `bin/flashgate demo` (its stdout, also kept
# in var/log/demo.out); the stack is stopped afterwards, quietly (its output in var/log/down.log).
demo: deps build ## start the stack, create a sale and run the load against it, stop the stack
	@mkdir -p var/log; rc=0; : > var/log/demo.out; \
	if $(STACK) up; then \
		. $(SECRETS); $(BIN) demo --target "$(DEMO_TARGET)" | tee var/log/demo.out || rc=$$?; \
	else \
		rc=$$?; echo "make demo: stack up failed" | tee var/log/demo.out >&2; \
	fi; \
	$(STACK) down > var/log/down.log 2>&1 || echo "make demo: stack down failed, see var/log/down.log" >&2; \
	exit $$rc

# The sale-day drill: every sale-day command (pause, resume, audit, order list/show/cancel, export,
# dlq list/redrive, audit-log, close) run against a sale that `flashgate bench` floods, each checked;
# the transcript is var/log/saleday.out. Starts the stack if it is not up (and stops it after).
saleday: deps build ## the sale-day commands, each checked, against a sale flooded by flashgate bench
	@BIN=$(BIN) scripts/saleday.sh

# The admission protocol's model (spec/admission.pml, docs/verification.md), checked by spin: each
# configuration exhaustively (no violation), each bug switch (a violation), the price without
# replicas (a violation). Table in var/verify/summary.txt; BENCHMARKS.md keeps its figures.
verify: deps ## model-check the admission protocol (spin): every configuration, every bug switch
	@scripts/verify.sh

# flashgate against its yardsticks in one run (Redis EVALSHA, nginx's fixed answer, the seeds'
# synchronous design; purchases, refusals, p99 at half the peak, backend ingestion, RSS with 10,000
# connections), each audited: writes BENCHMARKS.md's generated section and bench/results.json, raw
# outputs in var/bench/; the last lines are "target <name>: <figure> (goal <goal>) met|missed".
# Settings: BENCH_DURATION, BENCH_CONCURRENCY, BENCH_USERS, BENCH_INGEST_ORDERS, BENCH_CONNS,
# BENCH_PROFILE (scripts/bench.sh). Leaves a running stack as it found it.
bench: deps build bench-build ## flashgate vs Redis, nginx and the seeds' design: BENCHMARKS.md, bench/results.json
	@BENCH_PROFILE=$${BENCH_PROFILE:-1} scripts/bench.sh

# Every fuzz target (func FuzzXxx) in turn, FUZZTIME each (default 60s); one line per target with its
# executions, also in var/fuzz/summary.txt. Needs no servers. Not part of `make test`.
FUZZTIME ?= 60s
fuzz: ## run every Go fuzz target for FUZZTIME each (default 60s): executions per target
	@GO=$(GO) FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

bench-go: deps ## run the Go benchmarks (go test -bench)
	$(GO) test -run '^$$' -bench . -benchmem ./...

# wrk against nginx answering a fixed 409 and against a gateway answering a sold-out sale, same
# threads/connections/duration (BENCH_THREADS, BENCH_CONNS, BENCH_DURATION); the last line is
# "edge: gateway-soldout/nginx-static = R". Leaves a running stack as it found it.
bench-edge: deps build ## wrk: gateway sold-out 409 vs nginx static 409 (edge ratio R)
	@scripts/bench-edge.sh

# Hostile clients (docs/hostile.md): slowloris, silent connections, slow bodies, pipelining, churn,
# smuggling, oversized bodies, junk commands and fd exhaustion against the gateway's port and nginx's, a probe
# beside each; one line per attack and port, then "target <name>: ... met|missed". Writes
# bench/hostile-results.json and BENCHMARKS.md's make hostile section. Settings: HOSTILE_DURATION,
# HOSTILE_ARGS, HOSTILE_STRICT (scripts/hostile.sh). Leaves a running stack as it found it.
hostile: deps build ## hostile-client suite against :8080 and :8000: BENCHMARKS.md, bench/hostile-results.json
	@scripts/hostile.sh

lint: ## go vet and a gofmt check
	$(GO) vet ./...
	@files="$$(find . -name '*.go' -not -path './var/*' -not -path './bin/*' -print0 | xargs -0r $(GOFMT) -l)"; \
	if [[ -n "$$files" ]]; then echo "gofmt needed on:"; echo "$$files"; exit 1; fi

fmt: ## gofmt -w the sources
	@find . -name '*.go' -not -path './var/*' -not -path './bin/*' -print0 | xargs -0r $(GOFMT) -w

# The live view's charting library, uPlot, is vendored under backend/ui/vendor/uplot and embedded
# in the binary: the version and the npm tarball's integrity are pinned in scripts/vendor-uplot.sh.
vendor-ui: ## re-vendor uPlot (the live view's charts) from the npm registry, pinned and checked
	@scripts/vendor-uplot.sh

vendor-ui-check: ## check backend/ui/vendor/uplot is exactly what the pinned uPlot tarball gives
	@scripts/vendor-uplot.sh --check

clean: ## remove bin/
	rm -rf bin/

# Each scenario runs a stack of its own (private Redis, NATS, MariaDB, gateway and backend
# processes on free ports), so this runs beside anything else. The last line is the summary.
# CHAOS_RUN narrows the suite to some scenarios (a go test -run pattern, e.g. 'TestChaos/patch').
CHAOS_RUN ?= TestChaos
chaos: deps ## fault suite: kill/stop each part mid-flood, then check the invariants and every client's history (REDIS=cluster NATS=cluster GATEWAYS=3 BACKENDS=2: on the fleet)
	@mkdir -p var/chaos var/log; rm -f var/chaos/report.txt; rc=0; \
	REDIS="$(REDIS)" NATS="$(NATS)" GATEWAYS="$(GATEWAYS)" BACKENDS="$(BACKENDS)" \
	CHAOS_REPORT=$(CURDIR)/var/chaos/report.txt $(GO) test -count=1 -v -timeout 30m -run '$(CHAOS_RUN)' ./chaos > var/log/chaos.log 2>&1 || rc=$$?; \
	grep -E '^\s+[a-z_]+_test.go|^--- |^FAIL|^ok' var/log/chaos.log || true; \
	if [[ -s var/chaos/report.txt ]]; then cat var/chaos/report.txt; else tail -n 30 var/log/chaos.log; fi; \
	exit $$rc
