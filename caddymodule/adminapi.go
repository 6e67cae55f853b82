package caddymodule

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves /mcp_serializer/ on Caddy's admin endpoint: what the
// session tables hold, and dropping a stuck session. Sessions appear by
// the hash the logs use, never by id.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.mcp_serializer",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

const (
	adminSessionsPath = "/mcp_serializer/sessions"
	defaultListLimit  = 100
	maxListLimit      = 1000
)

// Routes returns the admin routes of the module.
func (adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{
		Pattern: "/mcp_serializer/",
		Handler: caddy.AdminHandlerFunc(serveAdmin),
	}}
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	switch path := r.URL.Path; {
	case path == adminSessionsPath || path == adminSessionsPath+"/":
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, r, http.MethodGet)
		}
		return listSessions(w, r)
	case strings.HasPrefix(path, adminSessionsPath+"/") && !strings.Contains(path[len(adminSessionsPath)+1:], "/"):
		if r.Method != http.MethodDelete {
			return methodNotAllowed(w, r, http.MethodDelete)
		}
		return dropSession(w, r, path[len(adminSessionsPath)+1:])
	}
	return apiError(http.StatusNotFound, "not found: %s (try GET %s)", r.URL.Path, adminSessionsPath)
}

// tableReport is one session table in GET /mcp_serializer/sessions.
type tableReport struct {
	Name     string          `json:"name"`
	Counts   tableCounts     `json:"counts"`
	Matching int             `json:"matching"` // sessions matching ?state=
	Sessions []sessionReport `json:"sessions"` // at most ?limit= of them, least recently used first
}

type tableCounts struct {
	Sessions        int `json:"sessions"`
	Initializing    int `json:"initializing"`
	Open            int `json:"open"`
	Rejecting       int `json:"rejecting"`
	InFlight        int `json:"in_flight"`
	Streaming       int `json:"streaming"`
	Waiting         int `json:"waiting"`
	WaitingRequests int `json:"waiting_requests"`
}

type sessionReport struct {
	SessionHash string  `json:"session_hash"`
	State       string  `json:"state"`
	InFlight    bool    `json:"in_flight"`
	Streaming   bool    `json:"streaming"`
	Waiting     int     `json:"waiting"`
	AgeSeconds  float64 `json:"age_seconds"`
	IdleSeconds float64 `json:"idle_seconds"`
}

// stateFilters are the values of ?state=.
var stateFilters = map[string]func(serializer.SessionStatus) bool{
	"initializing": func(s serializer.SessionStatus) bool { return s.Gate == serializer.GateInitializing },
	"open":         func(s serializer.SessionStatus) bool { return s.Gate == serializer.GateOpen },
	"rejecting":    func(s serializer.SessionStatus) bool { return s.Gate == serializer.GateRejecting },
	"in_flight":    func(s serializer.SessionStatus) bool { return s.InFlight },
	"streaming":    func(s serializer.SessionStatus) bool { return s.Streaming },
	"waiting":      func(s serializer.SessionStatus) bool { return s.Waiting > 0 },
}

func listSessions(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit := defaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxListLimit {
			return apiError(http.StatusBadRequest, "limit must be an integer from 0 to %d, got %q", maxListLimit, v)
		}
		limit = n
	}
	match := func(serializer.SessionStatus) bool { return true }
	if v := q.Get("state"); v != "" {
		f, ok := stateFilters[v]
		if !ok {
			return apiError(http.StatusBadRequest, "unknown state %q (want initializing, open, rejecting, in_flight, streaming or waiting)", v)
		}
		match = f
	}
	named, err := namedTables(q)
	if err != nil {
		return err
	}

	reports := []tableReport{}
	for _, nt := range named {
		rep := tableReport{Name: nt.name, Sessions: []sessionReport{}}
		sum := nt.table.Inspect(func(s serializer.SessionStatus) {
			if !match(s) {
				return
			}
			rep.Matching++
			if len(rep.Sessions) < limit {
				rep.Sessions = append(rep.Sessions, sessionReport{
					SessionHash: serializer.SessionHash(s.ID),
					State:       string(s.Gate),
					InFlight:    s.InFlight,
					Streaming:   s.Streaming,
					Waiting:     s.Waiting,
					AgeSeconds:  seconds(s.Age),
					IdleSeconds: seconds(s.Idle),
				})
			}
		})
		rep.Counts = tableCounts{
			Sessions: sum.Sessions, Initializing: sum.Initializing, Open: sum.Open, Rejecting: sum.Rejecting,
			InFlight: sum.InFlight, Streaming: sum.Streaming, Waiting: sum.Waiting, WaitingRequests: sum.WaitingTotal,
		}
		reports = append(reports, rep)
	}
	return writeJSON(w, http.StatusOK, map[string]any{"tables": reports})
}

// seconds rounds to the millisecond: enough to tell stuck from busy.
func seconds(d time.Duration) float64 {
	return math.Round(d.Seconds()*1000) / 1000
}

type droppedReport struct {
	Table       string `json:"table"`
	SessionHash string `json:"session_hash"`
	Answered    int    `json:"answered"` // waiting requests answered 503
}

// dropSession forgets the session with this hash in every table that has
// it (or in ?table= only). Its waiting requests are answered 503.
func dropSession(w http.ResponseWriter, r *http.Request, hash string) error {
	if !isSessionHash(hash) {
		return apiError(http.StatusBadRequest, "%q is not a session hash: want the 12 lowercase hex digits the logs and GET %s show", hash, adminSessionsPath)
	}
	named, err := namedTables(r.URL.Query())
	if err != nil {
		return err
	}
	dropped := []droppedReport{}
	for _, nt := range named {
		var ids []string
		nt.table.Inspect(func(s serializer.SessionStatus) {
			if serializer.SessionHash(s.ID) == hash {
				ids = append(ids, s.ID)
			}
		})
		for _, id := range ids {
			if answered, ok := nt.table.Drop(id); ok {
				dropped = append(dropped, droppedReport{Table: nt.name, SessionHash: hash, Answered: answered})
			}
		}
	}
	if len(dropped) == 0 {
		return apiError(http.StatusNotFound, "no session with hash %s", hash)
	}
	for _, d := range dropped {
		caddy.Log().Named("admin.api.mcp_serializer").Warn("session dropped on the admin endpoint",
			zap.String("table", d.Table), zap.String("session", d.SessionHash), zap.Int("answered", d.Answered))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"dropped": dropped})
}

func isSessionHash(s string) bool {
	if len(s) != 12 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

type namedTable struct {
	name  string
	table *serializer.Table
}

// namedTables returns the live tables by name, or the one ?table= names.
func namedTables(q map[string][]string) ([]namedTable, error) {
	var out []namedTable
	tables.Range(func(key, v any) bool {
		out = append(out, namedTable{strings.TrimPrefix(key.(string), poolKeyPrefix), v.(pooledTable).Table})
		return true
	})
	slices.SortFunc(out, func(a, b namedTable) int { return strings.Compare(a.name, b.name) })
	if names, ok := q["table"]; ok {
		want := names[0]
		out = slices.DeleteFunc(out, func(nt namedTable) bool { return nt.name != want })
		if len(out) == 0 {
			return nil, apiError(http.StatusNotFound, "no session table named %q", want)
		}
	}
	return out, nil
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) error {
	w.Header().Set("Allow", allow)
	return apiError(http.StatusMethodNotAllowed, "method %s not allowed here (allowed: %s)", r.Method, allow)
}

func apiError(status int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	body, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(append(body, '\n'))
	return err
}

// Interface guards
var _ caddy.AdminRouter = adminAPI{}
