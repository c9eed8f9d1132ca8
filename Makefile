# Cheetah's tasks. `make test` is the test command CI runs.
GO       ?= go
BIN      ?= bin/cheetah
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PKGS     ?= ./...

.PHONY: build run test test-short bench fuzz postgres vet tidy clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/cheetah

# The broker on its embedded SQLite store in ./cheetah-data.
run:
	$(GO) run ./cmd/cheetah serve

# Every test, with the race detector, against a real PostgreSQL (started
# first if it is not answering) and real SQLite files.
test: postgres
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

test-short:
	$(GO) test -count=1 -short $(PKGS)

postgres:
	@scripts/ensure-postgres

# Benchmarks: figures are read, never asserted.
bench: postgres
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
