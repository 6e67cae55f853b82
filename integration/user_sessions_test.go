package integration

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type usersResult struct {
	OK             bool           `json:"ok"`
	Error          string         `json:"error"`
	Sessions       int            `json:"sessions"`
	LostSessions   int            `json:"lostSessions"`
	FailedSessions int            `json:"failedSessions"`
	HTTPErrors     map[string]int `json:"httpErrors"`
	Samples        []string       `json:"samples"`
	ElapsedMs      int            `json:"elapsedMs"`
}

func (r usersResult) summary() string {
	return fmt.Sprintf("%d sessions: %d lost, %d failed otherwise, HTTP errors %v, took %d ms",
		r.Sessions, r.LostSessions, r.FailedSessions, r.HTTPErrors, r.ElapsedMs)
}

// connectUsers runs the client's users mode at url: rounds of 4 clients of
// each of 2 users at once, with the passwords given ("shared" or
// "distinct"). It fails the test if the client could not run them all.
func connectUsers(t *testing.T, label, url string, rounds int, passwords string, extra ...string) usersResult {
	t.Helper()
	var res usersResult
	args := append([]string{"users", "--url", url, "--rounds", strconv.Itoa(rounds), "--users", "2", "--clients", "4",
		"--passwords", passwords, "--timeout", "10000"}, extra...)
	runClient(t, 5*time.Minute, &res, args...)
	t.Logf("%s: %s", label, res.summary())
	logSamples(t, res.Samples)
	if res.Error != "" {
		t.Fatalf("%s: client error: %s", label, res.Error)
	}
	if res.Sessions != rounds*8 {
		t.Fatalf("%s: %d sessions ran, want %d", label, res.Sessions, rounds*8)
	}
	return res
}

// wantNoSessionLost fails the test unless every session kept working.
func wantNoSessionLost(t *testing.T, label string, res usersResult) {
	t.Helper()
	if !res.OK || res.LostSessions != 0 || res.FailedSessions != 0 {
		t.Errorf("%s: %s; want none lost or failed", label, res.summary())
	}
}

// userSessionsBackend is the Caddyfile lines that serve the integration
// PHP app, whose /user-mcp keeps all of a user's sessions in one record,
// with every request writing its session's activity back (the adapter:
// once a minute per session), so that the race shows within a short run.
func userSessionsBackend(fpm *phpFPM) string {
	return fmt.Sprintf("\troot * %s\n\tphp_fastcgi unix/%s {\n\t\tenv MCP_PHP_ACTIVITY_SECONDS 0\n\t}\n", fpm.PublicDir, fpm.Socket)
}

// A backend that keeps all of a user's sessions in one record, as
// WordPress's MCP Adapter does, loses sessions when several clients of one
// user connect at once: each initialize, activity update and DELETE
// writes the whole record back. Ordering by session changes nothing; the
// key setting on the credential runs them one at a time, and none is lost.
func TestSessionsOfOneUserAreLostUnlessTheKeyIsTheirCredential(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	const rounds = 10
	run := func(label, directives string) usersResult {
		base := startCaddy(t, caddySite(directives+userSessionsBackend(fpm)))
		return connectUsers(t, label, base+"/user-mcp", rounds, "shared")
	}
	direct := run("direct to PHP-FPM", "")
	bySession := run("through mcp_serializer, without key", "\tmcp_serializer\n")
	byUser := run("through mcp_serializer, key on the credential", "\tmcp_serializer {\n\t\tkey {http.request.header.Authorization}\n\t}\n")
	t.Logf("PHP error log: %s", fpm.logSummary())

	if direct.LostSessions == 0 {
		t.Errorf("direct: no session lost: the race between one user's sessions is not reproduced")
	}
	if bySession.LostSessions == 0 {
		t.Errorf("without key: no session lost, want about as many as directly (%d): ordering by session cannot order a user's sessions", direct.LostSessions)
	}
	wantNoSessionLost(t, "with key on the credential", byUser)
}

// Each client of a user with a password of its own, as WordPress's
// Application Passwords are made: keyed on the Authorization header, each
// password is a line of its own and sessions are lost; with key
// basic_user, every password of the user shares one line, and none is.
func TestEveryPasswordOfAUserSharesItsLineWithKeyBasicUser(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	run := func(label, key string, extra ...string) usersResult {
		base := startCaddy(t, caddySite("\tmcp_serializer {\n\t\tkey "+key+"\n\t}\n"+userSessionsBackend(fpm)))
		return connectUsers(t, label, base+"/user-mcp", 10, "distinct", extra...)
	}
	byHeader := run("key on the Authorization header", "{http.request.header.Authorization}")
	byUser := run("key basic_user", "basic_user")
	byEmail := run("key basic_user, one client of each user by e-mail", "basic_user", "--email-client")
	if byHeader.LostSessions == 0 {
		t.Errorf("keyed on the Authorization header, no session lost: the race between one user's passwords is not reproduced")
	}
	wantNoSessionLost(t, "key basic_user", byUser)
	wantNoSessionLost(t, "key basic_user, one client by e-mail", byEmail)
}

// stranger plays someone who knows only a user's name: it keeps slowBodies
// POSTs with wrong passwords open, each body larger than max_body, its
// first 5 KiB sent at once and then a byte a second, and floods
// initialize with a new wrong password each time from floodThreads
// goroutines, until stopped.
type stranger struct {
	sent     atomic.Int64 // flood requests sent
	answered atomic.Int64 // flood requests answered 401
	other    atomic.Int64 // flood requests answered otherwise
	stop     chan struct{}
	done     sync.WaitGroup
}

func startStranger(t *testing.T, url, user string, slowBodies, floodThreads int) *stranger {
	t.Helper()
	s := &stranger{stop: make(chan struct{})}
	host := strings.TrimPrefix(url[:strings.Index(url[len("http://"):], "/")+len("http://")], "http://")
	path := url[len("http://")+len(host):]
	basic := func(password string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
	}
	for i := range slowBodies {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		prefix := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"` + strings.Repeat("x", 5<<10)
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			path, host, basic(fmt.Sprintf("wrong-slow-%d", i)), 1<<20, prefix)
		s.done.Go(func() {
			defer conn.Close()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-s.stop:
					return
				case <-tick.C:
					conn.Write([]byte("x"))
				}
			}
		})
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for thread := range floodThreads {
		s.done.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-s.stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"stranger","version":"1"}}}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Authorization", basic(fmt.Sprintf("wrong-%d-%d", thread, n)))
				s.sent.Add(1)
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusUnauthorized {
					s.answered.Add(1)
				} else {
					s.other.Add(1)
				}
			}
		})
	}
	t.Cleanup(s.end)
	return s
}

func (s *stranger) end() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.done.Wait()
}

// With key basic_user, a stranger who knows only a user's name, keeping
// four slow bodies with wrong passwords open and flooding wrong-password
// initialize requests from four threads, costs the user's clients (4 of
// each of 2 users, a password each, one signing in by e-mail) no session:
// a credential joins the user's line only once the PHP app accepted it at
// key_proof.
func TestAStrangerWhoKnowsOnlyAUsersNameLosesTheUserNoSession(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 16})
	caddy := runCaddy(t, caddySite("\tmetrics /metrics\n\tmcp_serializer {\n\t\tkey basic_user\n\t\tmax_body 1KB\n\t}\n"+userSessionsBackend(fpm)))
	url := caddy.URL + "/user-mcp"
	quiet := connectUsers(t, "key basic_user, no stranger", url, 5, "distinct", "--email-client")
	wantNoSessionLost(t, "no stranger", quiet)

	s := startStranger(t, url, "user0", 4, 4)
	refused := func() float64 {
		return adminMetric(t, caddy.Admin, "caddy_mcp_serializer_proofs_total")[`{verdict="refused"}`]
	}
	// The slow bodies are open and the flood is on before the user's
	// clients start.
	for deadline := time.Now().Add(30 * time.Second); s.sent.Load() < 8; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("within 30 s, the stranger sent %d flood requests", s.sent.Load())
		}
	}
	attacked := connectUsers(t, "key basic_user, beside the stranger", url, 5, "distinct", "--email-client")
	flood := s.answered.Load()
	s.end()
	wantNoSessionLost(t, "beside the stranger", attacked)
	if flood == 0 {
		t.Errorf("the stranger's flood got no 401 from the PHP app: it was held, or never reached it")
	}
	t.Logf("the stranger's flood: %d answered 401, %d otherwise; %v credentials refused at key_proof; the user's clients took %d ms beside it, %d ms without",
		flood, s.other.Load(), refused(), attacked.ElapsedMs, quiet.ElapsedMs)
}
