package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	state    json.RawMessage // compared field by field: it may hold a password
}

type setting struct{ name, value string }

// claims holds, per loaded config and table name, the settings of the
// first handler provisioned; the others are compared with it.
var claims sync.Map // tableUse -> *tableClaim

// claimTable records this handler's table settings for its config (state
// as configured), or reports how they differ from those of a handler
// provisioned before it.
func (h *Handler) claimTable(ctx caddy.Context, cfg serializer.Config, state json.RawMessage) error {
	use := tableUse{config: ctx.GetMetricsRegistry(), name: h.Name}
	mine := &tableClaim{settings: append(tableSettings(cfg), setting{"order", h.Order}), state: state}
	v, loaded := claims.LoadOrStore(use, mine)
	if !loaded {
		h.claim, h.claimed = use, mine
		return nil
	}
	first := v.(*tableClaim)
	advice := func(name string) string {
		return fmt.Sprintf("handlers with the same name (%s) share one session table and its settings: "+
			"give each MCP endpoint its own `name`, or set %s the same in both", tableLabel(h.Name), name)
	}
	for i, s := range mine.settings {
		if other := first.settings[i]; s.value != other.value {
			return fmt.Errorf("%s: %s here but %s in another mcp_serializer handler of this config; %s",
				s.name, s.value, other.value, advice(s.name))
		}
	}
	if conflict := stateConflict(mine.state, first.state); conflict != "" {
		return fmt.Errorf("%s; %s", conflict, advice("state"))
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
// the README's settings table gives them.
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

// stateConflict says how two handlers' state settings differ, naming the
// engine and the fields that differ but never a value: a field may hold a
// password, and even a digest of one can be checked against guesses. It
// returns "" when they agree.
func stateConflict(mine, first json.RawMessage) string {
	if mine == nil && first == nil {
		return ""
	}
	a, b := stateFields(mine), stateFields(first)
	if a["module"] != b["module"] {
		return fmt.Sprintf("state: %s here but %s in another mcp_serializer handler of this config",
			stateEngineName(a), stateEngineName(b))
	}
	var differ []string
	for k, v := range a {
		if v != b[k] {
			differ = append(differ, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			differ = append(differ, k)
		}
	}
	if len(differ) == 0 {
		return ""
	}
	slices.Sort(differ)
	return fmt.Sprintf("state: %s settings differ from another mcp_serializer handler of this config in %s",
		stateEngineName(a), strings.Join(differ, ", "))
}

// stateFields flattens a state engine's JSON into its top-level fields,
// each value compacted so that spacing does not count as a difference;
// nil (no state) has none. Zero values are dropped: omitting a field and
// setting it to its zero value mean the same default.
func stateFields(raw json.RawMessage) map[string]string {
	fields := map[string]string{}
	var m map[string]json.RawMessage
	if raw == nil || json.Unmarshal(raw, &m) != nil {
		return fields
	}
	for k, v := range m {
		var compact bytes.Buffer
		if json.Compact(&compact, v) != nil {
			compact.Reset()
			compact.Write(v)
		}
		switch c := compact.String(); c {
		case `""`, "0", "null", "false", "[]", "{}":
		default:
			fields[k] = c
		}
	}
	return fields
}

func stateEngineName(fields map[string]string) string {
	var name string
	if json.Unmarshal([]byte(fields["module"]), &name) != nil || name == "" {
		return "none"
	}
	return name
}

func tableLabel(name string) string {
	if name == "" {
		return "none set, the default table"
	}
	return strconv.Quote(name)
}
