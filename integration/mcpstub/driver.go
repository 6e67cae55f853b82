package mcpstub

import (
	"context"
	"net/http"

	"github.com/mcpserializer/caddy-mcp-serializer/probe"
)

// The client driver is package probe, which `caddy mcp-probe` runs too;
// these names keep the stand-in's callers short.
type (
	Driver  = probe.Driver
	Result  = probe.Result
	Summary = probe.Summary
)

// RunPipelined performs n pipelined connects (with DELETE) against url, at
// most concurrency at a time; see probe.RunPipelined.
func RunPipelined(ctx context.Context, url string, n, concurrency int) Summary {
	return probe.RunPipelined(ctx, url, n, concurrency)
}

// PipelinedConnect runs one pipelined connect against url and ends the
// session with DELETE; see probe.PipelinedConnect.
func PipelinedConnect(ctx context.Context, client *http.Client, url string) Result {
	return probe.PipelinedConnect(ctx, client, url)
}

// NewClient returns an HTTP client pooled for concurrency connects; see
// probe.NewClient.
func NewClient(concurrency int) *http.Client { return probe.NewClient(concurrency) }
