# Cheetah's tasks. `make test` is the test command CI runs.
GO       ?= go
BIN      ?= bin/cheetah
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PKGS     ?= ./...

.PHONY: build run test test-short bench bench-go fuzz postgres vet lint tidy clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/cheetah

# The broker on its embedded SQLite store in ./cheetah-data.
run:
	$(GO) run ./cmd/cheetah serve

# Every test, with the race detector, against a real PostgreSQL (started
# first if it is not answering) and real SQLite files.
test: postgres chromium lint
	node --test extension/test/
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list $(PKGS) | grep -v /bench/)
	@# The harness's smoke test in short mode (scenarios 1 and 5): its full
	@# smoke run measures throughput under whatever else the machine runs.
	$(GO) test -count=1 -short -timeout 10m ./bench/...

test-short:
	$(GO) test -count=1 -short $(PKGS)

postgres:
	@scripts/ensure-postgres

# Benchmarks: figures are read, never asserted.
# `make bench` runs the harness of bench/ (Cheetah against a raw WebSocket
# echo, NATS, Redis and PostgreSQL, issue 6) at full size, about 15 minutes;
# BENCHFLAGS=-quick makes it a minute or two, BENCHFLAGS="-profile
# bench/out/profiles" adds pprof profiles. The table is printed; JSON and
# Markdown land in bench/out/. `make bench-go` runs the Go micro-benchmarks.
BENCHFLAGS ?=
bench: postgres
	@mkdir -p bench/out
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/cheetah-bench ./bench/cmd/cheetah-bench
	bin/cheetah-bench -json bench/out/latest.json -md bench/out/latest.md $(BENCHFLAGS)

bench-go: postgres
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s $(PKGS)

FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./protocol/
	@# Every other fuzz target in the repository, found by name, each for
	@# FUZZTIME (reliability/fuzz: HTTP JSON bodies, state-report reconciler).
	@# Crashers land in the package's testdata/fuzz and stay as seeds.
	@for dir in $$(grep -rl --exclude-dir=.git --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go | sed 's/^func //'); do \
	    [ "$$dir $$f" = "./protocol FuzzDecode" ] && continue; \
	    echo "$(GO) test -run '^$$' -fuzz '^$$f$$' -fuzztime $(FUZZTIME) $$dir/"; \
	    $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$dir/ || exit 1; \
	  done; \
	done

vet:
	$(GO) vet $(PKGS)

# staticcheck at a pinned version, fetched through the Go module proxy on
# first use; `make test` runs it before the tests.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	$(GO) run $(STATICCHECK) $(PKGS)

tidy:
	$(GO) mod tidy

clean:
	rm -rf bin cheetah-data

# The browser extension: bin/cheetah-extension.zip from extension/src (no
# build step, no download). Load it unpacked, or unzip it and load that.
.PHONY: extension chromium test-extension
extension:
	$(GO) run ./extension/cmd/pack -o bin/cheetah-extension.zip extension/src

# Debian's chromium for the extension's end-to-end test (installed with
# apt-get when /usr/bin/chromium is missing).
chromium:
	@scripts/ensure-chromium

# The extension's unit tests (Node's own runner) and its end-to-end test in
# headless chromium.
test-extension: chromium
	node --test extension/test/
	$(GO) test -race -count=1 ./extension/...

# The admin console's tests, three of them in headless chromium. With
# CONSOLE_SHOTS=<dir> the screenshots they take are kept there
# (docs/console-overview.png is its wide-overview.png).
.PHONY: test-console
CONSOLE_SHOTS ?=
test-console: chromium
	CHEETAH_CONSOLE_SCREENSHOTS=$(CONSOLE_SHOTS) $(GO) test -race -count=1 ./server/console/

# The reliability suite's long modes (issue 7; docs/reliability.md lists
# every test and the figures of the last long run). The quick modes run in
# `make test`. RELIABILITY_TESTFLAGS adds go test flags (e.g. -race).
RELIABILITY_TESTFLAGS ?=
.PHONY: soak chaos

# Soak: many clients and contexts under churn with an independent checker,
# on SQLite and PostgreSQL in turn, for SOAK_DURATION each.
SOAK_DURATION ?= 10m
SOAK_FLAGS    ?= -soak.clients 20 -soak.contexts 4 -soak.workers 32 -soak.stores sqlite,postgres
soak: postgres
	$(GO) test -count=1 -timeout 0 -v $(RELIABILITY_TESTFLAGS) -run '^TestSoak$$' ./reliability/soak/ \
		-soak.duration $(SOAK_DURATION) $(SOAK_FLAGS)

# Chaos: the faults package with CHAOS_ROUNDS SIGKILLs of the broker per
# store and CHAOS_PG_CYCLES PostgreSQL outages, then the long
# linearizability and security runs.
CHAOS_ROUNDS     ?= 25
CHAOS_PG_CYCLES  ?= 10
CHAOS_HISTORIES  ?= 400
CHAOS_FLOOD      ?= 3000
chaos: postgres
	$(GO) test -count=1 -timeout 0 -v $(RELIABILITY_TESTFLAGS) ./reliability/faults/ \
		-chaos.rounds $(CHAOS_ROUNDS) -chaos.pgcycles $(CHAOS_PG_CYCLES)
	$(GO) test -count=1 -timeout 0 -v $(RELIABILITY_TESTFLAGS) ./reliability/linearize/ -linearize.histories $(CHAOS_HISTORIES)
	$(GO) test -count=1 -timeout 0 -v $(RELIABILITY_TESTFLAGS) ./reliability/security/ \
		-security.flood $(CHAOS_FLOOD) -security.timing 1000000
