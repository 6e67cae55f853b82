package mcpstub

import (
	"encoding/json"
	"io"
	"net/http"
)

// sseWriter writes a text/event-stream response, flushing every event so a
// client (or a proxy in between) sees it when it is sent, not when the
// handler ends.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error // first write error: the client has gone
}

// startSSE sends the stream's headers at once.
func startSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Del("Content-Length")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	s.flush()
	return s
}

// message sends v as one "message" event.
func (s *sseWriter) message(v any) {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only the Backend's own values are written
	}
	s.write("event: message\ndata: " + string(data) + "\n\n")
}

// comment sends an SSE comment line, which clients ignore; it keeps idle
// connections (and proxies' idle timers) alive.
func (s *sseWriter) comment(text string) {
	s.write(": " + text + "\n\n")
}

func (s *sseWriter) write(chunk string) {
	if s.err != nil {
		return
	}
	if _, err := io.WriteString(s.w, chunk); err != nil {
		s.err = err
		return
	}
	s.flush()
}

func (s *sseWriter) flush() {
	if err := s.rc.Flush(); err != nil && s.err == nil {
		s.err = err
	}
}
