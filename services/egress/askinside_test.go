package egress_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

const stripeKey = "sk_test_SECRET_0123456789"

// An ask rule with a method holds that method of an https request too: the
// proxy opens the tunnel to a host it names and judges each request inside
// with its own method. The asked POST waits for a person and, allowed,
// leaves with the host's secret; a GET no rule allows is refused without
// asking; a denied POST never reaches the host, nor does the key. Without
// the tunnel opened for the ask (the control), the same POST is refused at
// its CONNECT and nobody is asked.
func TestAMethodAskRuleHoldsThatMethodInsideAnHTTPSTunnel(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32
	stripe, roots := tlsServerFor(t, "api.stripe.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, r.Method+" "+r.URL.Path+" auth="+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	}))
	_, port, _ := net.SplitHostPort(stripe.Listener.Addr().String())
	askRule := "POST api.stripe.test:" + port
	launch := func(t *testing.T, ca *egress.CA) (proxy, chan egresspolicy.Ask, *streamed) {
		asks := make(chan egresspolicy.Ask, 4)
		var st streamed
		pol := egress.Policy{RunID: "r1", Ask: []isolation.EgressRule{rule(t, askRule)}, CA: ca}
		if ca != nil {
			pol.Secrets = []egress.Secret{{Name: "stripe", Hosts: []string{"api.stripe.test"}, Header: "Authorization", Format: "Bearer {}", Value: stripeKey}}
		}
		p := startProxy(t, pol, egress.Options{Resolver: resolver{"api.stripe.test": "127.0.0.1"}, RootCAs: roots, OnDecision: st.add,
			OnAsk: func(a egresspolicy.Ask) { asks <- a }})
		return p, asks, &st
	}
	client := func(p proxy, ca *egress.CA) *http.Client {
		c := p.client(token)
		pool := x509.NewCertPool()
		if ca != nil {
			pool.AppendCertsFromPEM([]byte(ca.CertPEM))
		}
		c.Transport.(*tokenRT).rt.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
		return c
	}
	nextAsk := func(t *testing.T, asks chan egresspolicy.Ask) egresspolicy.Ask {
		t.Helper()
		select {
		case a := <-asks:
			return a
		case <-time.After(10 * time.Second):
			t.Fatal("nobody was asked")
		}
		return egresspolicy.Ask{}
	}
	url := "https://api.stripe.test:" + port + "/v1/charges"

	ca, err := egress.NewCA("r1", egresspolicy.InsideAskHosts([]egresspolicy.Rule{rule(t, askRule)}), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p, asks, st := launch(t, &ca)
	c := client(p, &ca)

	t.Run("A_GET_no_rule_allows_is_refused_unasked", func(t *testing.T) {
		code, body := do(t, c, "GET", url, "")
		if code != http.StatusForbidden || !strings.Contains(body, "no [agents.egress] allow rule matches GET api.stripe.test") {
			t.Fatalf("GET: %d %q, want berth's 403", code, body)
		}
		select {
		case a := <-asks:
			t.Fatalf("a GET was asked: %+v", a)
		default:
		}
	})
	t.Run("The_asked_POST_waits_and_allowed_leaves_with_the_key", func(t *testing.T) {
		type result struct {
			code int
			body string
		}
		got := make(chan result, 1)
		go func() { code, body := do(t, c, "POST", url, "amount=100"); got <- result{code, body} }()
		a := nextAsk(t, asks)
		if a.Method != "POST" || a.Host != "api.stripe.test" || a.Path != "/v1/charges" || a.Rule != askRule {
			t.Fatalf("ask = %+v, want the POST with its path", a)
		}
		if reached.Load() != 0 {
			t.Fatal("the host was reached before anybody answered")
		}
		if err := p.srv.Answer(egresspolicy.Answer{ID: a.ID, Allow: true, By: "slack:U1"}); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.code != 200 || r.body != "POST /v1/charges auth="+stripeKey {
			t.Fatalf("allowed POST: %d %q, want the host's answer to the keyed request", r.code, r.body)
		}
	})
	t.Run("A_denied_POST_reaches_nothing", func(t *testing.T) {
		before := reached.Load()
		got := make(chan string, 1)
		go func() { _, body := do(t, c, "POST", url, "amount=200"); got <- body }()
		a := nextAsk(t, asks)
		p.srv.Answer(egresspolicy.Answer{ID: a.ID, By: "slack:U1"})
		if body := <-got; !strings.Contains(body, "denied by slack:U1") || strings.Contains(body, stripeKey) {
			t.Fatalf("denied POST: %q", body)
		}
		if reached.Load() != before {
			t.Fatal("a denied POST reached the host")
		}
	})
	if ds := st.all(); len(ds) == 0 {
		t.Fatal("no decisions recorded")
	}

	t.Run("Control_without_the_runs_CA_the_POST_is_refused_at_its_CONNECT", func(t *testing.T) {
		p, asks, _ := launch(t, nil)
		code, body := do(t, client(p, nil), "POST", url, "amount=300")
		if code == 200 || strings.Contains(body, stripeKey) {
			t.Fatalf("POST without interception: %d %q", code, body)
		}
		select {
		case a := <-asks:
			t.Fatalf("asked without interception: %+v", a)
		default:
		}
	})
}
