package caddymodule

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Handlers with the same name share one session table, and a table has
// one value of each of its settings: a session created through one
// handler may be continued through another, so no single handler's value
// could be said to govern it. Within one loaded config, handlers that
// share a table must therefore agree, and a config where they do not is
// refused rather than letting the last one provisioned win in silence.

// tableUse names a table as used by one loaded config.
type tableUse struct {
	// The config's metrics registry: Caddy makes one per loaded config and
	// hands it to every module of it, while ctx.Context differs per server.
	config *prometheus.Registry
	name   string
}

// tableClaim is the first handler's settings for a table in a config.
type tableClaim struct {
	settings []setting
}

type setting struct{ name, value string }

// claims holds, per loaded config and table name, the settings of the
// first handler provisioned; the others are compared with it.
var claims sync.Map // tableUse -> *tableClaim

// claimTable records this handler's table settings for its config, or
// reports how they differ from those of a handler provisioned before it.
func (h *Handler) claimTable(ctx caddy.Context, cfg serializer.Config) error {
	use := tableUse{config: ctx.GetMetricsRegistry(), name: h.Name}
	mine := &tableClaim{settings: append(tableSettings(cfg), setting{"state", stateSetting(h.StateRaw)})}
	v, loaded := claims.LoadOrStore(use, mine)
	if !loaded {
		h.claim, h.claimed = use, mine
		return nil
	}
	first := v.(*tableClaim)
	for i, s := range mine.settings {
		if other := first.settings[i]; s.value != other.value {
			return fmt.Errorf("%s: %s here but %s in another mcp_serializer handler of this config; "+
				"handlers with the same name (%s) share one session table and its settings: "+
				"give each MCP endpoint its own `name`, or set %s the same in both",
				s.name, s.value, other.value, tableLabel(h.Name), s.name)
		}
	}
	return nil
}

// releaseClaim forgets this config's claim when its first handler is
// cleaned up, which happens when the config is unloaded.
func (h *Handler) releaseClaim() {
	if h.claimed != nil {
		claims.CompareAndDelete(h.claim, h.claimed)
	}
}

// tableSettings lists a table's settings in config syntax, in the order
// the README gives them.
func tableSettings(c serializer.Config) []setting {
	return []setting{
		{"init_timeout", c.InitTimeout.String()},
		{"on_init_timeout", c.OnInitTimeout.String()},
		{"queue_timeout", c.QueueTimeout.String()},
		{"max_queue", strconv.Itoa(c.MaxQueue)},
		{"max_sessions", strconv.Itoa(c.MaxSessions)},
		{"session_ttl", c.SessionTTL.String()},
	}
}

// stateSetting names a handler's state engine, and a digest of its
// settings rather than the settings, which may hold a password.
func stateSetting(raw json.RawMessage) string {
	if raw == nil {
		return "none"
	}
	var mod struct{ Module string }
	_ = json.Unmarshal(raw, &mod)
	var compact bytes.Buffer
	if json.Compact(&compact, raw) != nil {
		compact.Reset()
		compact.Write(raw)
	}
	sum := sha256.Sum256(compact.Bytes())
	return fmt.Sprintf("%s (settings %x)", mod.Module, sum[:4])
}

func tableLabel(name string) string {
	if name == "" {
		return "none set, the default table"
	}
	return strconv.Quote(name)
}
