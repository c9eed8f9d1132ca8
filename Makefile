# Cheetah's tasks. `make test` is the test command CI runs.
GO       ?= go
BIN      ?= bin/cheetah
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PKGS     ?= ./...

.PHONY: build run test test-short bench bench-go fuzz postgres vet tidy clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/cheetah

# The broker on its embedded SQLite store in ./cheetah-data.
run:
	$(GO) run ./cmd/cheetah serve

# Every test, with the race detector, against a real PostgreSQL (started
# first if it is not answering) and real SQLite files.
test: postgres chromium
	node --test extension/test/
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

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

vet:
	$(GO) vet $(PKGS)

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
