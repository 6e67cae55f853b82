package caddymodule_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

func TestOrderOwnerIsRefusedWhereItCannotWork(t *testing.T) {
	for _, tc := range []struct{ state, want string }{
		{"state storage\n\t\torder cluster", "order cluster needs shared state that records session owners (state redis)"},
		{"order cluster", "order cluster needs shared state that records session owners (state redis)"},
		{"state redis\n\t\torder everywhere", `order: unknown value "everywhere" (want owner or local)`},
		{"state storage\n\t\torder owner", "order owner needs shared state that records session owners (state redis)"},
		{"order owner", "order owner needs shared state that records session owners (state redis)"},
		{"state redis\n\t\torder owner\n\t\tadvertise 10.0.0.5", "advertise: want host:port"},
		{"state redis\n\t\torder local\n\t\tadvertise 10.0.0.5:8080", "advertise is for order owner only"},
		{"state redis\n\t\tupstream_sessions instance\n\t\tinstance_name a", "upstream_sessions instance needs advertise"},
		{"state redis\n\t\torder local\n\t\tupstream_sessions instance\n\t\tinstance_name a", "upstream_sessions instance needs order owner"},
		{"state redis\n\t\tinstance_name a", "instance_name is for upstream_sessions instance only"},
		{"state redis\n\t\tupstream_sessions replica", `upstream_sessions: unknown value "replica"`},
	} {
		caddyfile := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\nhttp://127.0.0.1:%d {\n\tmcp_serializer {\n\t\t%s\n\t}\n\trespond ok\n}\n",
			testnet.FreePort(t), tc.state)
		err := loadCaddyfile(t, caddyfile)
		if err == nil {
			_ = caddy.Stop()
			t.Fatalf("%q loaded; want it refused", tc.state)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one saying %q", tc.state, err, tc.want)
		}
	}
}
