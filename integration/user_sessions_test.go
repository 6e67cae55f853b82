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

// A backend that keeps all of a user's sessions in one record, as
// WordPress's MCP Adapter does, loses sessions when several clients of one
// user connect at once: each initialize, activity update and DELETE
// writes the whole record back. Ordering by session changes nothing; the
// key setting on the credential runs them one at a time, and none is lost.
func TestSessionsOfOneUserAreLostUnlessTheKeyIsTheirCredential(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	// Every request writes its session's activity back (the adapter: once a
	// minute per session), so that the race shows within a short run.
	backend := fmt.Sprintf("\troot * %s\n\tphp_fastcgi unix/%s {\n\t\tenv MCP_PHP_ACTIVITY_SECONDS 0\n\t}\n", fpm.PublicDir, fpm.Socket)
	const rounds, users, clients = 10, 2, 4
	run := func(label, directives string) usersResult {
		base := startCaddy(t, caddySite(directives+backend))
		var res usersResult
		runClient(t, 5*time.Minute, &res, "users", "--url", base+"/user-mcp",
			"--rounds", strconv.Itoa(rounds), "--users", strconv.Itoa(users), "--clients", strconv.Itoa(clients), "--timeout", "10000")
		t.Logf("%s: %s", label, res.summary())
		logSamples(t, res.Samples)
		if res.Error != "" {
			t.Fatalf("%s: client error: %s", label, res.Error)
		}
		if res.Sessions != rounds*users*clients {
			t.Fatalf("%s: %d sessions ran, want %d", label, res.Sessions, rounds*users*clients)
		}
		return res
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
	if byUser.LostSessions != 0 || byUser.FailedSessions != 0 || !byUser.OK {
		t.Errorf("with key on the credential: %s; want none lost or failed", byUser.summary())
	}
}
