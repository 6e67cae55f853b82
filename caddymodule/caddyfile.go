package caddymodule

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/settings"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("mcp_serializer", parseCaddyfile)
	// Before "invoke" is before handle/route blocks, reverse_proxy and
	// php_fastcgi at the same nesting level; a top-level handle block
	// would otherwise take the request first.
	httpcaddyfile.RegisterDirectiveOrder("mcp_serializer", httpcaddyfile.Before, "invoke")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	mcp_serializer [<matcher>] {
//	    name            <table name>
//	    init_timeout    <duration>
//	    on_init_timeout forward|synthesize|reject
//	    queue_timeout   <duration>
//	    max_queue       <requests per session>
//	    max_sessions    <sessions>
//	    session_ttl     <duration>
//	    max_body        <size>
//	    max_buffered    <size>
//	    get_stream      reject|forward
//	    state           redis|storage [{ <engine settings> }]
//	    order           local|cluster|owner
//	    advertise       <host:port>
//	    upstream_sessions shared|instance
//	    instance_name   <name>
//	    key             <placeholder>
//	}
//
// Every setting is optional; defaults are applied in Provision. The
// engines' settings are in redisstate.Engine.UnmarshalCaddyfile and
// storagestate.Engine.UnmarshalCaddyfile.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return settings.Each(d, func(setting, val string) (err error) {
		switch setting {
		case "state":
			return h.unmarshalState(d)
		case "name":
			h.Name = val
		case "init_timeout":
			h.InitTimeout, err = settings.Duration(val)
		case "on_init_timeout":
			h.OnInitTimeout = val
		case "queue_timeout":
			h.QueueTimeout, err = settings.Duration(val)
		case "max_queue":
			h.MaxQueue, err = strconv.Atoi(val)
		case "max_sessions":
			h.MaxSessions, err = strconv.Atoi(val)
		case "session_ttl":
			h.SessionTTL, err = settings.Duration(val)
		case "max_body":
			h.MaxBody, err = parseSize(val)
		case "max_buffered":
			h.MaxBuffered, err = parseSize(val)
		case "get_stream":
			h.GetStream = val
		case "order":
			h.Order = val
		case "key":
			h.Key = val
		case "key_secret":
			h.KeySecret = val
		case "key_proof":
			h.KeyProof = val
		case "advertise":
			h.Advertise = val
		case "upstream_sessions":
			h.UpstreamSessions = val
		case "instance_name":
			h.InstanceName = val
		default:
			return d.Errf("unrecognized mcp_serializer setting %q", setting)
		}
		return settings.End(d, setting, err)
	})
}

// unmarshalState reads `state <engine> [{ … }]`, the engine's own
// settings parsed by the engine module.
func (h *Handler) unmarshalState(d *caddyfile.Dispenser) error {
	name := d.Val()
	unm, err := caddyfile.UnmarshalModule(d, "http.handlers.mcp_serializer.state."+name)
	if err != nil {
		return err
	}
	h.StateRaw = caddyconfig.JSONModuleObject(unm, "module", name, nil)
	return nil
}

func parseSize(s string) (int64, error) {
	size, err := humanize.ParseBytes(s)
	return int64(size), err
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
