package caddymodule

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/mcpserializer/caddy-mcp-serializer/probe"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "mcp-probe",
		Usage: "--url <url> [--compare <url>] [-n <connects>] [--concurrency <n>] [--sse] [--timeout <duration>] [--json]",
		Short: "Shows whether an MCP server fails clients that pipeline their first requests",
		Long: `
Connects to an MCP endpoint (Streamable HTTP) the way pipelining clients
do, -n times, --concurrency at a time. Each connect sends initialize; then
notifications/initialized, logging/setLevel and tools/list without waiting
for each other; then tools/list again to check that the session still works;
then DELETE.

It counts replies rejected with -32600 ("not initialized"), HTTP errors,
replies with the wrong id, transport errors and sessions left broken, and
prints a table. --compare probes a second URL after the first and shows
both side by side, for example the backend directly and through Caddy with
mcp_serializer. --json prints one JSON object instead.

Each request, its response body included, must complete within --timeout.
--sse asks for text/event-stream replies first.

Exit status: 0 when every connect succeeded, 1 when any failed, 2 for bad
input (a bad flag or URL, nothing listening, a target that is not an MCP
server with sessions).
`,
		CobraFunc: func(cmd *cobra.Command) {
			f := cmd.Flags()
			f.String("url", "", "MCP endpoint to probe (required)")
			f.String("compare", "", "second MCP endpoint, probed after --url and shown beside it")
			f.IntP("connects", "n", probe.DefaultConnects, "connects per URL")
			f.Int("concurrency", probe.DefaultConcurrency, "connects at a time")
			f.Bool("sse", false, "ask for text/event-stream replies first")
			f.Duration("timeout", probe.DefaultTimeout, "longest wait for each request's complete response")
			f.Bool("json", false, "print one JSON object instead of the table")
			// A flag that does not parse is bad input too: status 2, with
			// the message logged the way Caddy logs a command's error.
			cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
				return caddycmd.WrapCommandFuncForCobra(func(caddycmd.Flags) (int, error) {
					return probe.ExitBadInput, err
				})(c, nil)
			})
			cmd.RunE = caddycmd.WrapCommandFuncForCobra(cmdMCPProbe)
		},
	})
}

func cmdMCPProbe(fl caddycmd.Flags) (int, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := probe.Options{
		URL:               fl.String("url"),
		Compare:           fl.String("compare"),
		Connects:          fl.Int("connects"),
		Concurrency:       fl.Int("concurrency"),
		PreferEventStream: fl.Bool("sse"),
		Timeout:           fl.Duration("timeout"),
		JSON:              fl.Bool("json"),
		Stdout:            os.Stdout,
	}
	// Progress only for a person watching: never into a pipe or a file.
	if term.IsTerminal(int(os.Stdout.Fd())) && term.IsTerminal(int(os.Stderr.Fd())) {
		o.Progress = os.Stderr
	}
	return probe.Main(ctx, o)
}
