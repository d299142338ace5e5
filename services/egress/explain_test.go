package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// egressCase is one request asked of the proxy and of explain.
type egressCase struct {
	name, method, url string
	host              string // Host inside an intercepted tunnel
	body              string
}

// askProxy sends c to the proxy as the sandbox would and says whether it
// passed: a tunnel established, or an answer from the destination.
func askProxy(t *testing.T, socket string, roots *x509.CertPool, c egressCase) bool {
	t.Helper()
	u, err := url.Parse(c.url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	if u.Scheme == "https" {
		hostport := u.Host
		if u.Port() == "" {
			hostport += ":443"
		}
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", hostport, hostport, token)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || c.host == "" {
			return resp.StatusCode == 200
		}
		tc := tls.Client(conn, &tls.Config{RootCAs: roots, ServerName: u.Hostname()})
		fmt.Fprintf(tc, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", c.method, u.RequestURI(), c.host, len(c.body), c.body)
		resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	target := c.url
	if strings.HasPrefix(u.Path, egresspolicy.ProvidersPrefix) && u.Host == "127.0.0.1:3128" {
		target = u.RequestURI() // what berth-agent's relay sends: origin form
	}
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", c.method, target, u.Host, token, len(c.body), c.body)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == 200
}

// berthctl egress explain and the proxy judge with the same code: every
// class of request the proxy decides gets the same answer from both.
func TestExplainAgreesWithTheProxy(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t, nil)
	model := newRecordingUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") })
	st := newSecretSetup(t, egress.Secret{})
	port := up.port()
	res := resolver{"mirror.test": "127.0.0.1", "rebind.test": "127.0.0.1", "named.test": "127.0.0.1", "meta.test": "169.254.169.254", "api.github.test": "127.0.0.1"}
	ghPort := st.port
	allow := rules(t, "GET,HEAD mirror.test:"+port, "*:"+port, "named.test:"+port, "CONNECT mirror.test:"+port, "api.github.test:"+ghPort)
	providers := []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "m", Key: openKey}}
	secrets := []egress.Secret{{Name: "github", Hosts: []string{"api.github.test"}, Header: "Authorization", Format: "Bearer {}", Value: githubToken}}
	addrs := egresspolicy.NewClassifier(nil, nil)
	// The secret's upstream trusts its own test CA: reuse the secret setup's
	// proxy options by starting this proxy with the same CA and roots.
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: allow, Providers: providers, Secrets: secrets, CA: &st.ca},
		egress.Options{Resolver: res, Addresses: addrs, RootCAs: st.roots})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(st.ca.CertPEM))
	prov := "http://127.0.0.1:3128/providers/openai/"
	cases := []egressCase{
		{name: "a_provider_call", method: "POST", url: prov + "chat/completions", body: `{"model":"m"}`},
		{name: "a_provider_call_with_another_model", method: "POST", url: prov + "chat/completions", body: `{"model":"x"}`},
		{name: "a_model_case_variant", method: "POST", url: prov + "chat/completions", body: `{"model":"x","Model":"m"}`},
		{name: "a_duplicate_model", method: "POST", url: prov + "chat/completions", body: `{"model":"m","model":"x"}`},
		{name: "a_provider_path_climbing_out", method: "POST", url: prov + "../../anything", body: `{"model":"m"}`},
		{name: "a_provider_path_encoded", method: "POST", url: prov + "%2e%2e%2fanything", body: `{"model":"m"}`},
		{name: "a_provider_path_not_an_endpoint", method: "POST", url: prov + "files", body: `{"model":"m"}`},
		{name: "a_provider_GET_on_a_model_call", method: "GET", url: prov + "chat/completions"},
		{name: "the_models_list", method: "GET", url: prov + "models"},
		{name: "a_provider_of_no_run", method: "POST", url: "http://127.0.0.1:3128/providers/mistral/chat/completions", body: `{"model":"m"}`},
		{name: "a_host_no_rule_names", method: "GET", url: "http://evil.example/"},
		{name: "the_rule_naming_the_host_with_its_method", method: "GET", url: "http://mirror.test:" + port + "/"},
		{name: "rules_crossing_method_from_one_exception_from_another", method: "POST", url: "http://mirror.test:" + port + "/"},
		{name: "a_name_resolving_to_loopback", method: "GET", url: "http://rebind.test:" + port + "/"},
		{name: "the_metadata_service_by_name", method: "GET", url: "http://meta.test:" + port + "/"},
		{name: "loopback_by_address", method: "GET", url: "http://127.0.0.1:" + port + "/"},
		{name: "loopback_IPv4_mapped", method: "GET", url: "http://[::ffff:127.0.0.1]:" + port + "/"},
		{name: "loopback_NAT64", method: "GET", url: "http://[64:ff9b::7f00:1]:" + port + "/"},
		{name: "a_rule_naming_an_internal_host", method: "GET", url: "http://named.test:" + port + "/"},
		{name: "a_tunnel_the_naming_rule_allows", method: "CONNECT", url: "https://mirror.test:" + port},
		{name: "a_tunnel_to_loopback_under_a_star", method: "CONNECT", url: "https://rebind.test:" + port},
		{name: "a_secret_host_its_own_origin", method: "GET", url: "https://api.github.test:" + ghPort + "/user", host: "api.github.test:" + ghPort},
		{name: "a_secret_host_fronting_another", method: "GET", url: "https://api.github.test:" + ghPort + "/user", host: "other.example"},
	}
	judge := &egresspolicy.Judge{Allow: allow, Providers: providers, Secrets: secrets, Resolver: res, Addresses: addrs}
	plan := &isolation.EgressPlan{ProxyAddr: "127.0.0.1:3128", Allow: allow, Providers: providers, Secrets: secrets}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			proxied := askProxy(t, p.socket, roots, c)
			q := egresspolicy.Question{Method: c.method, URL: c.url, ProxyAddr: "127.0.0.1:3128", Host: c.host}
			if c.body != "" {
				q.Body = []byte(c.body)
			}
			v, err := judge.Explain(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed != proxied {
				t.Fatalf("the proxy passed it: %v; explain says allowed=%v (%s; %s)", proxied, v.Allowed, v.Reason, v.Note)
			}
			if c.body != "" || c.host != "" {
				return // the scheduler's explain asks without a body or a Host
			}
			sv, err := plan.Decide(context.Background(), c.method, c.url, res, addrs)
			if err != nil {
				t.Fatal(err)
			}
			if sv.Allowed != proxied {
				t.Fatalf("the proxy passed it: %v; the scheduler's explain says allowed=%v (%s)", proxied, sv.Allowed, sv.Reason)
			}
		})
	}
}
