package probe

import (
	"bufio"
	"io"
	"strings"
)

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
