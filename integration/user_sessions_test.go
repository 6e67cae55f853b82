package integration

import (
	"fmt"
	"strconv"
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
func connectUsers(t *testing.T, label, url string, rounds int, passwords string) usersResult {
	t.Helper()
	var res usersResult
	runClient(t, 5*time.Minute, &res, "users", "--url", url, "--rounds", strconv.Itoa(rounds), "--users", "2", "--clients", "4",
		"--passwords", passwords, "--timeout", "10000")
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
	run := func(label, key string) usersResult {
		base := startCaddy(t, caddySite("\tmcp_serializer {\n\t\tkey "+key+"\n\t}\n"+userSessionsBackend(fpm)))
		return connectUsers(t, label, base+"/user-mcp", 10, "distinct")
	}
	byHeader := run("key on the Authorization header", "{http.request.header.Authorization}")
	byUser := run("key basic_user", "basic_user")
	if byHeader.LostSessions == 0 {
		t.Errorf("keyed on the Authorization header, no session lost: the race between one user's passwords is not reproduced")
	}
	wantNoSessionLost(t, "key basic_user", byUser)
}
