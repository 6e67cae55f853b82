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
GO_SOURCES   := $(shell find . -name '*.go' -not -path './bin/*' -not -path '*/node_modules/*') go.mod go.sum

export MCP_SERIALIZER_CADDY := $(CADDY)

.PHONY: run test unit integration fuzz bench caddy clean

$(XCADDY):
	GOBIN=$(BIN) go install github.com/caddyserver/xcaddy/cmd/xcaddy@$(XCADDY_VERSION)

# Caddy with this checkout's module, the way users build it (plus --replace).
$(CADDY): $(XCADDY) $(GO_SOURCES)
	GOPROXY="$(LOCAL_GOPROXY)" $(XCADDY) build $(CADDY_VERSION) \
		--with $(MODULE)/caddymodule --replace $(MODULE)=$(CURDIR) --output $(CADDY)

caddy: $(CADDY)

clean:
	rm -rf $(BIN)
