package mcpstub

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
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

// Event is one Server-Sent Event.
type Event struct {
	Name string // "event:" field; "" means "message"
	ID   string // "id:" field
	Data string // "data:" lines joined with "\n"
}

// EventReader reads Server-Sent Events from a response body as they arrive,
// one Next call per event; comment lines and retry fields are skipped.
type EventReader struct {
	br *bufio.Reader
}

// NewEventReader returns an EventReader reading r.
func NewEventReader(r io.Reader) *EventReader {
	return &EventReader{br: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next event that carries data. It returns io.EOF at the end
// of the stream; an event cut short by the end of the stream is still
// returned.
func (e *EventReader) Next() (Event, error) {
	var ev Event
	var data []string
	hasData := false
	for {
		line, err := e.br.ReadString('\n')
		if err != nil && (err != io.EOF || line == "") {
			if err == io.EOF && hasData {
				ev.Data = strings.Join(data, "\n")
				return ev, nil
			}
			return Event{}, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if hasData {
				ev.Data = strings.Join(data, "\n")
				return ev, nil
			}
			ev = Event{} // an event without data is not dispatched
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "data":
			data = append(data, value)
			hasData = true
		case "event":
			ev.Name = value
		case "id":
			ev.ID = value
		}
		if err == io.EOF {
			if hasData {
				ev.Data = strings.Join(data, "\n")
				return ev, nil
			}
			return Event{}, io.EOF
		}
	}
}
