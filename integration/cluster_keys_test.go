package integration

import (
	"strconv"
	"sync"
	"testing"
	"time"
)

// cartKey is the instances' `key` for the v2 client's cart handle, which
// the client mirrors into the Mcp-Param-Cart header.
const cartKey = "{http.request.header.Mcp-Param-Cart}"

// cartAdds is the parallel cart_add calls of one handle race.
const cartAdds = 24

// timedCartRace is one handle race and when it started; Race is nil when
// none ran (the connect or cart_create failed).
type timedCartRace struct {
	Started time.Time
	Race    *cartRace
	Summary string
}

// runCartRace runs one handle race through the front: cart_create, then
// cartAdds cart_add calls on that cart at once, spread by the front over
// the instances, then cart_get.
func runCartRace(t *testing.T, c *cluster) timedCartRace {
	t.Helper()
	var res v2Connects
	r := timedCartRace{Started: time.Now()}
	runV2Client(t, 2*time.Minute, &res, "connects", "--url", c.Front+"/mcp", "--negotiation", "pin",
		"--n", "1", "--adds", strconv.Itoa(cartAdds))
	r.Race, r.Summary = res.First.Cart, res.summary()
	return r
}

// wantNoLostUpdate fails the test unless the race ran with no failed call
// and kept every item: no two calls on the cart overlapped in PHP.
func wantNoLostUpdate(t *testing.T, label string, r timedCartRace) {
	t.Helper()
	switch {
	case r.Race == nil:
		t.Errorf("%s: no handle race ran: %s", label, r.Summary)
	case r.Race.FailedCalls != 0 || r.Race.Lost != 0 || r.Race.Items != cartAdds:
		t.Errorf("%s: %d of %d items kept, %d lost, %d calls failed %q", label, r.Race.Items, cartAdds, r.Race.Lost, r.Race.FailedCalls, r.Race.FailedSamples)
	}
}

// cartRaces are handle races run one after another in the background.
type cartRaces struct {
	mu    sync.Mutex
	races []timedCartRace
	begun []time.Time // when each race, the one under way included, started
	quit  chan struct{}
	ended chan struct{}
}

// cartRacesInBackground runs handle races one after another until stop is
// called.
func cartRacesInBackground(t *testing.T, c *cluster) *cartRaces {
	t.Helper()
	r := &cartRaces{quit: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(r.ended) // also when runV2Client fails the test
		for {
			select {
			case <-r.quit:
				return
			default:
			}
			r.mu.Lock()
			r.begun = append(r.begun, time.Now())
			r.mu.Unlock()
			race := runCartRace(t, c)
			r.mu.Lock()
			r.races = append(r.races, race)
			r.mu.Unlock()
		}
	}()
	return r
}

// waitStartedAfter waits until a race has started after at, failing the
// test if none does within 3 minutes (a race lasts seconds).
func (r *cartRaces) waitStartedAfter(t *testing.T, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r.mu.Lock()
		started := len(r.begun) > 0 && r.begun[len(r.begun)-1].After(at)
		r.mu.Unlock()
		if started {
			return
		}
		select {
		case <-r.ended:
			t.Fatal("the handle races ended before one started after " + at.Format(time.StampMilli))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no handle race started within 3 minutes")
		}
	}
}

// stop waits for the race under way and returns them all.
func (r *cartRaces) stop(t *testing.T) []timedCartRace {
	t.Helper()
	close(r.quit)
	select {
	case <-r.ended:
	case <-time.After(3 * time.Minute):
		t.Fatal("the handle race under way did not end within 3 minutes")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.races
}

// Parallel calls on one cart handle through three instances behind round
// robin, the instances keyed on the handle: with order owner (the default
// with state redis) they run one at a time, at the first instance that met
// the handle, and no update is lost; with order local each instance orders only its
// own share, calls on different instances overlap in PHP and updates are
// lost (which shows the race is there to be stopped).
func TestClusterRoundRobinRunsCallsOnOneHandleOneAtATime(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	r := startRedis(t)
	state := "state redis {\n\taddress " + r.Addr + "\n}"

	c := startCluster(t, clusterOptions{State: state, Key: cartKey, Balancer: caddyRoundRobin})
	for i := 0; i < 3; i++ {
		wantNoLostUpdate(t, "order owner, race "+strconv.Itoa(i+1), runCartRace(t, c))
	}
	if errs := nonZero(c.stateErrors(t)); len(errs) != 0 {
		t.Errorf("failed state calls: %v", errs)
	}

	local := startCluster(t, clusterOptions{State: state, Order: "local", Key: cartKey, Balancer: caddyRoundRobin})
	lost := 0
	for i := 0; i < 3; i++ {
		race := runCartRace(t, local)
		if race.Race == nil {
			t.Fatalf("order local: no handle race ran: %s", race.Summary)
		}
		lost += race.Race.Lost
	}
	t.Logf("order local: %d of %d updates lost over 3 races", lost, 3*cartAdds)
	if lost == 0 {
		t.Error("order local lost no update: the race across instances is not reproduced (widen MCP_PHP_CART_MS)")
	}
}

// Several clients of each user, each with a password of its own, connect
// at once through three instances behind round robin, keyed on the user
// (key basic_user), to a backend that keeps all of a user's sessions in
// one record: with order owner every request of a user meets at the
// instance that owns the user's key, which also tells its passwords
// proven, and no session is lost. Without state, behind a front that
// hashes Mcp-Session-Id, each instance orders only the sessions it holds,
// and sessions are lost. A client signing in by e-mail address is in its
// user's line too.
func TestClusterRoundRobinKeepsEverySessionOfAUserKeyedOnTheCredential(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	r := startRedis(t)
	state := "state redis {\n\taddress " + r.Addr + "\n}"
	const key = "basic_user"

	// One key_secret on every instance: each hashes the user alike.
	t.Setenv("MCP_TEST_KEY_SECRET", "cluster-test-secret")
	c := startCluster(t, clusterOptions{State: state, Key: key, KeySecret: "{env.MCP_TEST_KEY_SECRET}", Balancer: caddyRoundRobin})
	wantNoSessionLost(t, "order owner", connectUsers(t, "order owner", c.Front+"/user-mcp", 10, "distinct"))
	// One client of each user signs in by e-mail address: every instance
	// learns the login from the proof before it routes the user's line.
	wantNoSessionLost(t, "order owner, by e-mail", connectUsers(t, "order owner, by e-mail", c.Front+"/user-mcp", 10, "distinct", "--email-client"))
	t.Logf("order owner: forwards %v", nonZero(c.metrics(t, "caddy_mcp_serializer_forwards_total")))
	if errs := nonZero(c.stateErrors(t)); len(errs) != 0 {
		t.Errorf("failed state calls: %v", errs)
	}

	local := startCluster(t, clusterOptions{Key: key})
	if res := connectUsers(t, "without state", local.Front+"/user-mcp", 10, "distinct"); res.LostSessions == 0 {
		t.Error("without state, no session was lost: the race across instances is not reproduced")
	}
}
