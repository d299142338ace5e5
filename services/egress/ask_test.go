package egress_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// askingProxy is a launched berth-egress whose asks and decisions the test
// reads as the scheduler would get them.
type askingProxy struct {
	*egress.Proxy
	socket    string
	asks      chan egresspolicy.Ask
	settled   chan egresspolicy.Answer
	decisions chan isolation.EgressDecision
}

func launchAsking(t *testing.T, pol egress.Policy) askingProxy {
	t.Helper()
	testenv.NeedRoot(t)
	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	// A short path: a socket's is at most 107 bytes.
	root, err := os.MkdirTemp("", "ask")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o755)
	socket := filepath.Join(root, "egress", "run-ask", isolation.EgressSocketName)
	pol.RunID, pol.Agent, pol.Token = "run-ask", "asker", token
	ap := askingProxy{socket: socket, asks: make(chan egresspolicy.Ask, 16), settled: make(chan egresspolicy.Answer, 16), decisions: make(chan isolation.EgressDecision, 16)}
	p, err := egress.Launch(context.Background(), pol, egress.LaunchOptions{Logger: quiet, Binary: proxyBinary, User: nobody, Client: nobody, Socket: socket,
		OnAsk:        func(a egresspolicy.Ask) { ap.asks <- a },
		OnAskSettled: func(a egresspolicy.Answer) { ap.settled <- a },
		OnDecision:   func(d isolation.EgressDecision) { ap.decisions <- d }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	ap.Proxy = p
	return ap
}

func (ap askingProxy) nextAsk(t *testing.T) egresspolicy.Ask {
	t.Helper()
	select {
	case a := <-ap.asks:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy asked nothing")
	}
	return egresspolicy.Ask{}
}

func (ap askingProxy) nextDecision(t *testing.T) isolation.EgressDecision {
	t.Helper()
	select {
	case d := <-ap.decisions:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy decided nothing")
	}
	return isolation.EgressDecision{}
}

// settledAs fails unless the next ask settled as want.
func (ap askingProxy) settledAs(t *testing.T, want egresspolicy.Answer) {
	t.Helper()
	select {
	case got := <-ap.settled:
		if got != want {
			t.Fatalf("settled = %+v, want %+v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ask settled")
	}
}

// noAsk fails when the proxy asked anything before the decision last read:
// the proxy writes an ask before its request's decision, on one stdout.
func (ap askingProxy) noAsk(t *testing.T) {
	t.Helper()
	select {
	case a := <-ap.asks:
		t.Fatalf("the proxy asked %+v", a)
	default:
	}
}

// answered is what a tool got back through the proxy.
type answered struct {
	code    int
	body    string
	refused bool // X-Berth-Egress: refused
}

// send makes a tool's request through the proxy in the background: a held
// one answers only once the ask is.
func (ap askingProxy) send(t *testing.T, method, url string) <-chan answered {
	t.Helper()
	out := make(chan answered, 1)
	c := proxy{socket: ap.socket}.client(token)
	go func() {
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			out <- answered{body: err.Error()}
			return
		}
		// One request a connection: a tunnel's decision is made when it closes.
		req.Close = true
		resp, err := c.Do(req)
		if err != nil {
			out <- answered{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- answered{code: resp.StatusCode, body: string(b), refused: resp.Header.Get("X-Berth-Egress") == "refused"}
	}()
	return out
}

func (ap askingProxy) result(t *testing.T, got <-chan answered) answered {
	t.Helper()
	select {
	case a := <-got:
		return a
	case <-time.After(15 * time.Second):
		t.Fatal("the tool's request was never answered")
	}
	return answered{}
}

// upstream is a plain HTTP destination that counts its requests.
func upstream(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var reached atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, "upstream "+r.Method+" "+r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	return srv, &reached
}

func rule(t *testing.T, s string) egresspolicy.Rule {
	t.Helper()
	r, err := egresspolicy.ParseRule(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAnAskedRequestWaitsForAPersonsAnswer(t *testing.T) {
	t.Parallel()
	site, reached := upstream(t)
	addr := site.Listener.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	askRule := "GET,POST " + addr
	ap := launchAsking(t, egress.Policy{Ask: []egresspolicy.Rule{rule(t, askRule)}})

	t.Run("An_allow_answer_lets_it_reach_the_destination", func(t *testing.T) {
		got := ap.send(t, "GET", site.URL+"/charges")
		ask := ap.nextAsk(t)
		if ask.ID == "" || ask.Method != "GET" || ask.Host != "127.0.0.1" || ask.What() != "GET "+addr+"/charges" || ask.Rule != askRule {
			t.Fatalf("ask = %+v (port %s), want GET %s/charges by rule %q", ask, port, addr, askRule)
		}
		before := reached.Load()
		if err := ap.Answer(egresspolicy.Answer{ID: ask.ID, Allow: true, By: "slack:U012345"}); err != nil {
			t.Fatal(err)
		}
		res := ap.result(t, got)
		if res.code != 200 || res.body != "upstream GET /charges" || reached.Load() != before+1 {
			t.Fatalf("answer = %+v, upstream reached %d times more; want the upstream's 200", res, reached.Load()-before)
		}
		d := ap.nextDecision(t)
		if !d.Allowed || d.Rule != askRule || d.Reason != "approved by slack:U012345" {
			t.Fatalf("decision = %+v, want allowed by the ask rule, approved by slack:U012345", d)
		}
		ap.settledAs(t, egresspolicy.Answer{ID: ask.ID, Allow: true, By: "slack:U012345"})
	})

	t.Run("A_deny_answer_refuses_it_without_reaching_the_destination", func(t *testing.T) {
		before := reached.Load()
		got := ap.send(t, "POST", site.URL+"/charges")
		ask := ap.nextAsk(t)
		if err := ap.Answer(egresspolicy.Answer{ID: ask.ID, Allow: false, By: "berthctl:root"}); err != nil {
			t.Fatal(err)
		}
		res := ap.result(t, got)
		if res.code != http.StatusForbidden || !res.refused || !strings.Contains(res.body, "denied by berthctl:root") {
			t.Fatalf("answer = %+v, want berth's 403 refusal denied by berthctl:root", res)
		}
		if reached.Load() != before {
			t.Fatal("a denied request reached the destination")
		}
		d := ap.nextDecision(t)
		if d.Allowed || d.Reason != "denied by berthctl:root" {
			t.Fatalf("decision = %+v, want refused, denied by berthctl:root", d)
		}
		ap.settledAs(t, egresspolicy.Answer{ID: ask.ID, By: "berthctl:root"})
	})

	t.Run("Requests_held_at_once_are_each_asked_and_answered", func(t *testing.T) {
		first, second := ap.send(t, "GET", site.URL+"/a"), ap.send(t, "GET", site.URL+"/b")
		asks := map[string]egresspolicy.Ask{}
		for range 2 {
			a := ap.nextAsk(t)
			asks[a.Path] = a
		}
		if asks["/a"].ID == "" || asks["/a"].ID == asks["/b"].ID {
			t.Fatalf("asks = %+v, want one for each request, each its own id", asks)
		}
		ap.Answer(egresspolicy.Answer{ID: asks["/b"].ID, Allow: true, By: "slack:U1"})
		ap.Answer(egresspolicy.Answer{ID: asks["/a"].ID, Allow: false, By: "slack:U1"})
		if a, b := ap.result(t, first), ap.result(t, second); a.code != 403 || b.code != 200 || b.body != "upstream GET /b" {
			t.Fatalf("answers = %+v, %+v; want /a denied and /b allowed", a, b)
		}
		ap.nextDecision(t)
		ap.nextDecision(t)
		<-ap.settled
		<-ap.settled
	})

	t.Run("A_standing_answer_lets_later_requests_pass_unasked", func(t *testing.T) {
		got := ap.send(t, "GET", site.URL+"/first")
		ask := ap.nextAsk(t)
		ap.Answer(egresspolicy.Answer{ID: ask.ID, Allow: true, Standing: true, By: "discord:81234"})
		if res := ap.result(t, got); res.code != 200 {
			t.Fatalf("answer = %+v, want 200", res)
		}
		ap.nextDecision(t)
		ap.settledAs(t, egresspolicy.Answer{ID: ask.ID, Allow: true, By: "discord:81234"})
		if res := ap.result(t, ap.send(t, "GET", site.URL+"/later")); res.code != 200 || res.body != "upstream GET /later" {
			t.Fatalf("the later request: %+v, want 200 without an answer", res)
		}
		d := ap.nextDecision(t)
		ap.noAsk(t)
		if !d.Allowed || d.Reason != "approved earlier by discord:81234" {
			t.Fatalf("decision = %+v, want approved earlier by discord:81234", d)
		}
	})
}

func TestAHostAnAllowRuleNamesIsNeverAsked(t *testing.T) {
	t.Parallel()
	site, _ := upstream(t)
	addr := site.Listener.Addr().String()
	ap := launchAsking(t, egress.Policy{Allow: []egresspolicy.Rule{rule(t, addr)}, Ask: []egresspolicy.Rule{rule(t, addr), rule(t, "*.example.com")}})
	if res := ap.result(t, ap.send(t, "GET", site.URL+"/x")); res.code != 200 {
		t.Fatalf("answer = %+v, want 200 at once", res)
	}
	d := ap.nextDecision(t)
	ap.noAsk(t)
	if !d.Allowed || d.Rule != addr || d.Reason != "" {
		t.Fatalf("decision = %+v, want allowed by the allow rule, nobody asked", d)
	}
}

func TestATunnelToAnAskedHostIsHeldToo(t *testing.T) {
	t.Parallel()
	site := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls index") }))
	t.Cleanup(site.Close)
	addr := site.Listener.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	ap := launchAsking(t, egress.Policy{Ask: []egresspolicy.Rule{rule(t, addr)}})
	got := ap.send(t, "GET", site.URL+"/secret/path")
	ask := ap.nextAsk(t)
	if ask.Method != "CONNECT" || ask.Host != "127.0.0.1" || ask.Path != "" || ask.What() != "CONNECT 127.0.0.1:"+port {
		t.Fatalf("ask = %+v, want the tunnel's host and port only", ask)
	}
	ap.Answer(egresspolicy.Answer{ID: ask.ID, Allow: true, By: "slack:U1"})
	if res := ap.result(t, got); res.code != 200 || res.body != "tls index" {
		t.Fatalf("answer = %+v, want the site through the approved tunnel", res)
	}
	if d := ap.nextDecision(t); !d.Allowed || d.Method != "CONNECT" || d.Reason != "approved by slack:U1" {
		t.Fatalf("decision = %+v, want the approved tunnel", d)
	}
}

// An answer naming another ask releases nothing: the held request is
// refused only when its approval timeout passes.
func TestAnAnswerToAnotherAskReleasesNothingAndNobodyAnsweringRefuses(t *testing.T) {
	t.Parallel()
	site, reached := upstream(t)
	addr := site.Listener.Addr().String()
	ap := launchAsking(t, egress.Policy{Ask: []egresspolicy.Rule{rule(t, addr)}, ApprovalTimeout: time.Second})
	got := ap.send(t, "GET", site.URL+"/x")
	ask := ap.nextAsk(t)
	if err := ap.Answer(egresspolicy.Answer{ID: ask.ID + "0", Allow: true, By: "slack:U1"}); err != nil {
		t.Fatal(err)
	}
	res := ap.result(t, got)
	if res.code != http.StatusForbidden || !res.refused || !strings.Contains(res.body, "not approved within 1s") || reached.Load() != 0 {
		t.Fatalf("answer = %+v (upstream reached %d times), want 403 not approved within 1s", res, reached.Load())
	}
	d := ap.nextDecision(t)
	if d.Allowed || d.Reason != "not approved within 1s" {
		t.Fatalf("decision = %+v, want refused by the timeout", d)
	}
	ap.settledAs(t, egresspolicy.Answer{ID: ask.ID, By: "timeout"})
}

// A scheduler that answers no asks gets none: the request is refused at
// once instead of waiting for the timeout.
func TestWithoutAnyoneToAskTheRequestIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	site, reached := upstream(t)
	addr := site.Listener.Addr().String()
	p, socket := launch(t, "run-noask", token, egress.Policy{Ask: []egresspolicy.Rule{rule(t, addr)}})
	defer p.Stop()
	code, body := do(t, proxy{socket: socket}.client(token), "GET", site.URL+"/x", "")
	if code != http.StatusForbidden || !strings.Contains(body, "nobody is asked for this run") || reached.Load() != 0 {
		t.Fatalf("got %d %q, want 403: nobody is asked", code, body)
	}
}
