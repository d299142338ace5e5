package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// fakeResolver maps names to addresses, as a DNS server would.
type fakeResolver map[string]string

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	a, ok := r[host]
	if !ok {
		return nil, fmt.Errorf("no such host %s", host)
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

func TestEgressExplainSaysWhetherARequestWouldPassAndWhy(t *testing.T) {
	t.Parallel()
	cfg := egressConfig("/nonexistent/berth-agent", "/nonexistent/berth-egress", "http://127.0.0.1:9")
	cfg.Agents[0].Egress.Allow = []string{"pypi.org", "*.debian.org", "GET deb.example.org:8080"}
	// Names resolve as a DNS server answers them: the proxy's judging
	// decides on the address.
	names := fakeResolver{"pypi.org": "151.101.0.223", "deb.debian.org": "151.101.2.132", "mirror.debian.org": "10.1.2.3"}
	s, err := New(cfg, t.TempDir(), Options{Getenv: func(string) string { return egressTestKey }, Logger: quietLog, Resolver: names})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tests := []struct {
		name, method, url string
		allowed           bool
		want              string
	}{
		{"HTTPS_to_an_allowed_host_passes_by_its_rule", "GET", "https://pypi.org/simple/", true, "allowed by rule pypi.org"},
		{"A_glob_rule_allows_a_public_address", "GET", "http://deb.debian.org/debian", true, "allowed by rule *.debian.org"},
		{"A_glob_rule_refuses_an_internal_address", "GET", "http://mirror.debian.org/debian", false, "resolves to 10.1.2.3, a private address; only a rule naming mirror.debian.org exactly allows that"},
		{"A_method_the_rule_does_not_list_is_refused", "POST", "http://deb.example.org:8080/x", false, "no [agents.egress] allow rule matches POST deb.example.org:8080"},
		{"An_unlisted_host_is_refused", "GET", "https://evil.example/", false, "no [agents.egress] allow rule matches CONNECT evil.example:443"},
		{"The_provider_endpoint_is_explained", "POST", "http://127.0.0.1:9/v1/chat/completions", false, `with model "gpt-test"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := s.ExplainEgress("alpha", tt.method, tt.url)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed != tt.allowed || !strings.Contains(v.Reason+" "+v.Note, tt.want) {
				t.Fatalf("verdict %+v; want allowed=%v with %q", v, tt.allowed, tt.want)
			}
			if strings.Contains(v.Wire(), egressTestKey) {
				t.Fatal("the verdict carries the key")
			}
		})
	}
	if _, err := s.ExplainEgress("alpha", "GET", "pypi.org"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a URL without scheme: %v, want invalid argument", err)
	}
	if _, err := s.ExplainEgress("nope", "GET", "https://pypi.org/"); !errors.Is(err, ErrNotFound) {
		t.Errorf("an unknown agent: %v, want not found", err)
	}
}
