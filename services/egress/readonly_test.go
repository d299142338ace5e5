package egress_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/services/egress"
)

// Red-team tests of [agents.egress] mode = "read-only": each way to change
// something is refused with a reason and never reaches the destination,
// and the same requests pass without read-only (the control).

func TestReadOnlyRefusesEveryPlainRequestThatCouldChangeSomething(t *testing.T) {
	t.Parallel()
	for _, readOnly := range []bool{true, false} {
		up := newRecordingUpstream(t, nil)
		_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
		decisions := &streamed{}
		p := startProxy(t, egress.Policy{RunID: "r1", Agent: "reader", ReadOnly: readOnly, Allow: rules(t, "files.test:"+port)},
			egress.Options{Resolver: resolver{"files.test": "127.0.0.1"}, OnDecision: decisions.add})
		u := "http://files.test:" + port + "/doc"
		tests := []struct{ method, body string }{
			{"POST", "x=1"}, {"PUT", "new"}, {"PATCH", "p"}, {"DELETE", ""}, {"GET", "a body"},
		}
		for _, tt := range tests {
			code, body := do(t, p.client(token), tt.method, u, tt.body)
			switch {
			case readOnly && (code != http.StatusForbidden || !strings.Contains(body, "read-only egress")):
				t.Errorf("read-only %s with %q: %d %q, want 403 saying read-only", tt.method, tt.body, code, body)
			case !readOnly && code != http.StatusOK:
				t.Errorf("control %s: %d %q, want 200", tt.method, code, body)
			}
		}
		for _, m := range []string{"GET", "HEAD"} {
			if code, body := do(t, p.client(token), m, u, ""); code != http.StatusOK {
				t.Errorf("read-only=%v %s without a body: %d %q, want 200", readOnly, m, code, body)
			}
		}
		got := up.requests()
		if readOnly && len(got) != 2 {
			t.Errorf("read-only: the destination saw %d requests, want the GET and the HEAD only", len(got))
		}
		if readOnly && !refusedFor(decisions.all(), "read-only egress: agent \"reader\" may only GET and HEAD, not DELETE") {
			t.Errorf("no decision says why DELETE was refused: %+v", decisions.all())
		}
		if !readOnly && len(got) != 7 {
			t.Errorf("control: the destination saw %d requests, want 7", len(got))
		}
	}
}

// A read-only run's tunnel is intercepted with the run's CA, so a POST
// sent inside TLS is seen and refused; without read-only the same tunnel
// is a plain one and the POST goes through.
func TestReadOnlyReadsInsideEveryTunnel(t *testing.T) {
	t.Parallel()
	for _, readOnly := range []bool{true, false} {
		var seen []string
		srv, roots := tlsServerFor(t, "files.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = append(seen, r.Method)
			io.WriteString(w, "ok")
		}))
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		allow := rules(t, "files.test:"+port)
		pol := egress.Policy{RunID: "r1", Agent: "reader", ReadOnly: readOnly, Allow: allow}
		var ca egress.CA
		if readOnly {
			var err error
			// What the run's preparation makes for a read-only run.
			ca, err = egress.NewCA("r1", egresspolicy.ReadOnlyCAHosts(allow), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			pol.CA = &ca
		}
		decisions := &streamed{}
		p := startProxy(t, pol, egress.Options{Resolver: resolver{"files.test": "127.0.0.1"}, RootCAs: roots, OnDecision: decisions.add})
		c := p.client(token)
		if readOnly {
			c = interceptedClient(p, ca) // the sandbox trusts the run's CA only
		} else {
			c.Transport.(*tokenRT).rt.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true
		}
		u := "https://files.test:" + port + "/doc"
		if code, body := do(t, c, "GET", u, ""); code != 200 || body != "ok" {
			t.Fatalf("read-only=%v GET inside the tunnel: %d %q", readOnly, code, body)
		}
		code, body := do(t, c, "POST", u, "change")
		if readOnly && (code != http.StatusForbidden || !strings.Contains(body, "read-only egress")) {
			t.Fatalf("POST inside a read-only tunnel: %d %q, want 403 saying read-only", code, body)
		}
		if !readOnly && code != 200 {
			t.Fatalf("control POST inside a plain tunnel: %d %q", code, body)
		}
		want := []string{"GET"}
		if !readOnly {
			want = []string{"GET", "POST"}
		}
		if strings.Join(seen, ",") != strings.Join(want, ",") {
			t.Fatalf("read-only=%v: the host saw %v, want %v", readOnly, seen, want)
		}
	}
}

// A rule of "*" names no host a CA could be made for: a read-only run's
// tunnel under it cannot be read, so it is refused.
func TestReadOnlyRefusesATunnelItCannotRead(t *testing.T) {
	t.Parallel()
	srv, roots := tlsServerFor(t, "files.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	ca, err := egress.NewCA("r1", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, egress.Policy{RunID: "r1", Agent: "reader", ReadOnly: true, Allow: rules(t, "*:"+port), CA: &ca},
		// A public address: the refusal must be read-only's, not the
		// internal-address one (nothing is dialled either way).
		egress.Options{Resolver: resolver{"files.test": "93.184.215.14"}, RootCAs: roots})
	code, body, err := sendRaw(p.socket, "CONNECT", "files.test:"+port, "", nil)
	if err != nil || code != http.StatusForbidden || !strings.Contains(body, "cannot be tunnelled unread") {
		t.Fatalf("CONNECT under * in a read-only run: %d %q %v, want 403", code, body, err)
	}
}

// git fetches in a read-only run, and every push is refused with the
// reason git prints; without read-only the same push lands.
func TestReadOnlyFetchesButNeverPushes(t *testing.T) {
	t.Parallel()
	ro := newGitEnv(t, gitEnvOptions{configure: func(_ *gitEnv, pol *egress.Policy) { pol.ReadOnly = true }})
	dir := ro.clone("acme/web") // a fetch: allowed
	first := ro.forge.Ref("acme/web", "berth/x")
	ro.commit(dir, "a.txt", "one\n")
	out, err := ro.git(dir, "push", "origin", "HEAD:berth/x")
	if err == nil || !strings.Contains(out, "read-only egress") {
		t.Fatalf("a push in a read-only run: %v\n%s", err, out)
	}
	if got := ro.forge.Ref("acme/web", "berth/x"); got != first {
		t.Fatalf("berth/x moved to %q in a read-only run", got)
	}
	if !ro.refusedWith("may fetch but never push") {
		t.Fatalf("no decision says why: %+v", ro.decisions())
	}

	rw := newGitEnv(t, gitEnvOptions{})
	dir = rw.clone("acme/web")
	c := rw.commit(dir, "a.txt", "one\n")
	rw.mustGit(dir, "push", "-q", "origin", "HEAD:berth/x")
	if got := rw.forge.Ref("acme/web", "berth/x"); got != c {
		t.Fatalf("control: berth/x is %q, want %s", got, c)
	}
}
