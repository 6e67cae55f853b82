# Two commands on a fresh machine: `make run` and `make test`.
MODULE       := github.com/mcpserializer/caddy-mcp-serializer
CADDY_VERSION := v2.11.9
XCADDY_VERSION := v0.4.5
BIN          := $(CURDIR)/bin
XCADDY       := $(BIN)/xcaddy
CADDY        := $(BIN)/caddy
# The module proxy here answers 403 for paths it does not serve; "|off" makes
# that a not-found so xcaddy's --replace of this checkout is used.
LOCAL_GOPROXY := $(shell go env GOPROXY | cut -d, -f1)|off
# What the Caddy binary is built from (tests excluded), and the demo backend.
CADDY_SOURCES := $(filter-out %_test.go,$(wildcard caddymodule/*.go serializer/*.go stateengine/*.go redisstate/*.go storagestate/*.go owner/*.go internal/*/*.go probe/*.go)) go.mod go.sum
DEMO_SOURCES  := $(filter-out %_test.go,$(wildcard examples/demo-backend/*.go integration/mcpstub/*.go probe/*.go)) go.mod

export MCP_SERIALIZER_CADDY := $(CADDY)
export MCP_SERIALIZER_DEMO_BACKEND := $(CURDIR)/bin/demo-backend

DEMO         := $(BIN)/demo-backend
CLIENT_DEPS  := integration/client/node_modules/.package-lock.json
DEMO_LISTEN  := 127.0.0.1:9081

.PHONY: run cluster stateful test deps lint fuzz bench caddy clean flakes

$(XCADDY):
	GOBIN=$(BIN) go install github.com/caddyserver/xcaddy/cmd/xcaddy@$(XCADDY_VERSION)

# Caddy with this checkout's module, the way users build it (plus --replace).
$(CADDY): $(XCADDY) $(CADDY_SOURCES)
	GOPROXY="$(LOCAL_GOPROXY)" $(XCADDY) build $(CADDY_VERSION) \
		--with $(MODULE)/caddymodule --replace $(MODULE)=$(CURDIR) --output $(CADDY)

caddy: $(CADDY)

$(DEMO): $(DEMO_SOURCES)
	go build -o $(DEMO) ./examples/demo-backend

# The demo: the bundled backend (concurrent workers saving whole session
# records) with Caddy and mcp_serializer in front, per xcaddy.Caddyfile.
run: $(CADDY) $(DEMO)
	@$(DEMO) -listen $(DEMO_LISTEN) & demo=$$!; \
	trap 'kill $$demo 2>/dev/null' EXIT INT TERM; \
	echo; \
	echo "  MCP endpoint (through mcp_serializer): http://localhost:8080/mcp"; \
	echo "  demo backend, direct:                  http://$(DEMO_LISTEN)/mcp"; \
	echo "  compare: bin/caddy mcp-probe --url http://$(DEMO_LISTEN)/mcp --compare http://localhost:8080/mcp"; \
	echo; \
	$(CADDY) run --config xcaddy.Caddyfile --adapter caddyfile

# Redis, three demo backends on one session store, three Caddy instances
# with mcp_serializer and `state redis`, and a front hashing Mcp-Session-Id,
# all on loopback (examples/cluster).
cluster: $(CADDY) $(DEMO)
	CADDY=$(CADDY) DEMO_BACKEND=$(DEMO) examples/cluster/run

# Redis, three replicas of the MCP TypeScript SDK's server keeping their
# sessions in memory, a Caddy with mcp_serializer (upstream_sessions
# instance) in front of each, and a round-robin front, all on loopback
# (examples/stateful-replicas).
stateful: $(CADDY)
	CADDY=$(CADDY) examples/stateful-replicas/run

# PHP-FPM, pdo_sqlite, Node.js >= 20, redis-server, nginx and haproxy, installed with
# apt-get when missing (or the command to run is printed).
deps:
	@scripts/install-test-deps

# The MCP TypeScript SDK client used by the integration tests.
$(CLIENT_DEPS): integration/client/package.json integration/client/package-lock.json | deps
	npm ci --prefix integration/client --no-audit --no-fund

lint:
	@test -z "$$(gofmt -l . | grep -v node_modules)" || { gofmt -l . | grep -v node_modules; echo "gofmt needed"; exit 1; }
	go vet ./...

# Everything CI runs: lint, then every test (unit, in-process Caddy, and
# the real Caddy binary with PHP-FPM and the SDK client) with -race.
test: deps lint $(CADDY) $(DEMO) $(CLIENT_DEPS)
	go test -race -timeout 30m ./...

# Every test but the integration tests, COUNT times per -cpu in CPU, on the
# machine as it is and beside two busy loops; prints each test that failed
# with its failures/runs per condition (scripts/flakes: COUNT, CPU, PKGS,
# RUN, CONDITIONS, TIMEOUT).
flakes:
	scripts/flakes

# Plain Caddy and Caddy with mcp_serializer side by side, same binary, same
# load, alternating rounds (docs/benchmarks.md). Options: BENCH_FLAGS="-pairs 20 -v".
bench: $(CADDY)
	go run ./integration/bench -caddy $(CADDY) $(BENCH_FLAGS)

clean:
	rm -rf $(BIN)

# Each fuzz target runs for FUZZTIME (FUZZTIME_CADDY for the one that goes
# through Caddy, some 20 times slower per input); -fuzzminimizetime keeps the
# search from stalling on minimizing large inputs. A failing input is
# written to the package's testdata/fuzz/ and replayed by every later
# `go test`. A count (300000x) rather than a duration avoids Go 1.26's
# spurious "context deadline exceeded" at the end of a timed run on a busy
# machine (go.dev/issue/75804).
FUZZTIME ?= 30s
FUZZTIME_CADDY ?= $(FUZZTIME)
FUZZMINIMIZETIME ?= 2s
fuzz:
	go test ./serializer -run '^$$' -fuzz '^FuzzClassify$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME)
	go test ./serializer -run '^$$' -fuzz '^FuzzValid$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME)
	go test ./serializer -run '^$$' -fuzz '^FuzzValidSessionID$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME)
	go test ./owner -run '^$$' -fuzz '^FuzzSessionIDOwner$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME)
	go test ./caddymodule -run '^$$' -fuzz '^FuzzSessionPOST$$' -fuzztime $(FUZZTIME_CADDY) -fuzzminimizetime $(FUZZMINIMIZETIME)
