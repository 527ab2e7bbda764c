GO ?= go

# Tools are pinned in tools.mod/tools.sum (Go `tool` directives), kept apart
# from the main go.mod.
TOOLS_MODFILE := $(CURDIR)/tools.mod
BIN_DIR := $(CURDIR)/.bin
BUF := $(GO) tool -modfile=$(TOOLS_MODFILE) buf
PROTOC_PLUGINS := \
	google.golang.org/protobuf/cmd/protoc-gen-go \
	google.golang.org/grpc/cmd/protoc-gen-go-grpc

.PHONY: generate check-generated lint-proto

# Build the protoc plugins at the pinned versions into .bin/.
$(BIN_DIR)/.stamp: tools.mod tools.sum
	$(GO) build -modfile=$(TOOLS_MODFILE) -o $(BIN_DIR)/ $(PROTOC_PLUGINS)
	@touch $@

lint-proto:
	$(BUF) lint

generate: lint-proto $(BIN_DIR)/.stamp
	PATH="$(BIN_DIR):$$PATH" $(BUF) generate

# Regenerate and compare with the gen/ tree as it was before (works without
# any commit). Fails if anything was added, removed or changed.
check-generated:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	mkdir -p gen && cp -R gen "$$tmp/gen" && \
	$(MAKE) --no-print-directory generate && \
	if ! diff -r "$$tmp/gen" gen; then \
		echo "check-generated: gen/ is out of date; run 'make generate' and commit the result." >&2; \
		exit 1; \
	fi && echo "check-generated: gen/ is up to date."

.PHONY: test test-ts deps run build soak bench report stress-test stress-deps

# deps installs what the tests need and cannot fetch through Go modules:
# redis-server and haproxy (apt-get where possible) and the TypeScript
# client's npm packages.
deps:
	@if ! command -v redis-server >/dev/null 2>&1; then \
		echo "redis-server not found; installing it with apt-get"; \
		SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
		if command -v apt-get >/dev/null 2>&1 && $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server >/dev/null; then \
			echo "redis-server installed"; \
		else \
			echo "error: redis-server is required by the tests and could not be installed." >&2; \
			echo "Install it yourself (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) and re-run make test." >&2; \
			exit 1; \
		fi; \
	fi
	@redis-server --version
	@# Debian installs haproxy in /usr/sbin, often missing from a user's PATH;
	@# the tests look there too (internal/haproxytest).
	@export PATH="$$PATH:/usr/sbin:/usr/local/sbin"; \
	if ! command -v haproxy >/dev/null 2>&1; then \
		echo "haproxy not found; installing it with apt-get"; \
		SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
		if command -v apt-get >/dev/null 2>&1 && $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq haproxy >/dev/null; then \
			echo "haproxy installed"; \
		else \
			echo "error: haproxy is required by the tests (cmd/coordd runs it in front of three coordd; deploy/ checks haproxy.cfg) and could not be installed." >&2; \
			echo "Install it yourself (Debian/Ubuntu: apt-get install haproxy; macOS: brew install haproxy) and re-run make test." >&2; \
			exit 1; \
		fi; \
	fi; \
	haproxy -v | head -n 1
	@if ! command -v npm >/dev/null 2>&1; then \
		echo "node/npm not found; installing them with apt-get (the TypeScript client's tests need Node.js >= 20)"; \
		SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
		if ! (command -v apt-get >/dev/null 2>&1 && $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq nodejs npm >/dev/null); then \
			echo "error: Node.js >= 20 and npm are required by the TypeScript client's tests and could not be installed." >&2; \
			exit 1; \
		fi; \
	fi
	@echo "node $$(node --version), npm $$(npm --version)"

# test is the one command that runs every test: generated code checked
# against the protos, go test -race, then the TypeScript client and MCP
# server against a real coordd.
test: deps check-generated
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...
	$(MAKE) --no-print-directory test-ts

test-ts:
	cd clients/ts && npm ci --no-audit --no-fund && npm run build && npm test

build:
	$(GO) build -o $(BIN_DIR)/coordd ./cmd/coordd

# run starts coordd on the embedded single-node default (no Redis) with MDN
# as its upstream, listening on 127.0.0.1:50051.
run:
	$(GO) run ./cmd/coordd $(ARGS)

# bench prints figures (and ratios against a baseline in the same run); it
# asserts nothing about speed. It runs the Go benchmarks, then report.
bench: deps
	$(GO) test -run '^$$' -bench . -skip HolderCutOff -benchmem -benchtime 20x ./server/ ./coordinator/
	$(GO) test -run '^$$' -bench HolderCutOff -benchtime 1x ./server/
	$(GO) test -run '^$$' -bench . -benchmem ./clients/go/
	$(MAKE) --no-print-directory report

# report runs cmd/coordbench in full (a few minutes on 2 cores): coordd
# against the 200 ms polling design and a bare gRPC floor, printed as one
# table and written to bench/REPORT.md with the machine's facts and the
# plots (bench/*.png). `go run ./cmd/coordbench --quick` prints the same
# table in under a minute.
report: deps
	$(GO) run ./cmd/coordbench --report bench/REPORT.md

# soak repeats the concurrency and fault tests many times under -race.
soak: deps
	$(GO) test -race -count=20 -timeout 60m -run 'Stampede|Redis|Lock|Leader|Subscription|ManyKeys|Watchdog|StaleRefreshed|MaxAge|SingleNode|RateLimit|Breaker|Invalidate|FailedL2|LateFail|OlderL2|Bypass|Inline|Uncacheable|FailedRefresh|CustomKey' ./server/ ./coordinator/

# stress-test runs the whole Go suite under -race STRESS_RUNS times in a
# row (default 5) while stress-ng keeps every core busy, as on a small,
# busy CI machine. It is not part of make test. Each run's result is
# printed; the target fails if any run failed. STRESS_ARGS narrows it
# (e.g. STRESS_ARGS='-run Lock ./server/').
STRESS_RUNS ?= 5
STRESS_ARGS ?= ./...
stress-test: deps stress-deps
	@stress-ng --cpu $$(nproc) --timeout 0 --quiet & hog=$$!; \
	trap 'kill $$hog 2>/dev/null' EXIT; \
	failed=0; \
	for i in $$(seq 1 $(STRESS_RUNS)); do \
		start=$$(date +%s); \
		if $(GO) test -race -count=1 -timeout 20m $(STRESS_ARGS) > .stress-run-$$i.log 2>&1; then r=PASS; else r=FAIL; failed=$$((failed+1)); fi; \
		echo "stress-test run $$i/$(STRESS_RUNS): $$r in $$(( $$(date +%s) - start ))s (log: .stress-run-$$i.log)"; \
		grep -E '^(--- FAIL|FAIL|panic:)' .stress-run-$$i.log | head -20 || true; \
	done; \
	echo "stress-test: $$(( $(STRESS_RUNS) - failed ))/$(STRESS_RUNS) runs passed"; \
	test $$failed -eq 0

stress-deps:
	@if ! command -v stress-ng >/dev/null 2>&1; then \
		echo "stress-ng not found; installing it with apt-get"; \
		SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
		if ! (command -v apt-get >/dev/null 2>&1 && $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq stress-ng >/dev/null); then \
			echo "error: make stress-test needs stress-ng (Debian/Ubuntu: apt-get install stress-ng) and could not install it." >&2; \
			exit 1; \
		fi; \
	fi
