// Package mcpstub is a stand-in MCP server (Streamable HTTP transport) that
// behaves like a multi-process backend such as php-mcp under PHP-FPM. The
// client that connects the way pipelining MCP clients do is package probe;
// its names are repeated here (Driver, RunPipelined) for the tests.
//
// The point of the stand-in is the failure it reproduces. Every POST is
// handled as an independent worker would handle it: it loads a copy of the
// whole session record from a shared store, works for a while, and saves the
// whole record back, even when it rejected the request. Two POSTs of one
// session that overlap therefore race:
//
//   - ordering: logging/setLevel is checked against a record loaded before
//     notifications/initialized was saved, and is rejected with JSON-RPC
//     -32600 "Client session not initialized.";
//   - lost update: the rejected request then saves its stale copy
//     (initialized=false) over the notification's write, and the session
//     stays broken for every later request.
//
// Put a serializing proxy in front of a Backend and the failures disappear;
// talk to it directly with RunPipelined and they show up. The Backend also
// records every request it received (Requests, Count, Stats), so tests can
// assert what the upstream saw, in which order, and how many exchanges of a
// session overlapped.
package mcpstub
