package scheduler

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/berth-dev/berth/isolation"
)

func TestEgressExplainSaysWhetherARequestWouldPassAndWhy(t *testing.T) {
	t.Parallel()
	cfg := egressConfig("/nonexistent/berth-agent", "/nonexistent/berth-egress", "http://127.0.0.1:9")
	cfg.Agents[0].Egress.Allow = []string{"pypi.org", "*.debian.org", "GET deb.example.org:8080"}
	s, err := New(cfg, t.TempDir(), Options{Getenv: func(string) string { return egressTestKey }, Logger: quietLog})
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
		{"A_glob_rule_warns_about_internal_addresses", "GET", "http://deb.debian.org/debian", true, "refused at dial time if deb.debian.org resolves"},
		{"A_method_the_rule_does_not_list_is_refused", "POST", "http://deb.example.org:8080/x", false, "no [agents.egress] allow rule matches POST deb.example.org:8080"},
		{"An_unlisted_host_is_refused", "GET", "https://evil.example/", false, "no [agents.egress] allow rule matches CONNECT evil.example:443"},
		{"The_provider_endpoint_is_explained", "POST", "http://127.0.0.1:9/v1/chat/completions", false, `only as POST with model "gpt-test"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := s.ExplainEgressJSON("alpha", tt.method, tt.url)
			if err != nil {
				t.Fatal(err)
			}
			var v isolation.EgressVerdict
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatal(err)
			}
			if v.Allowed != tt.allowed || !strings.Contains(v.Reason+" "+v.Note, tt.want) {
				t.Fatalf("verdict %+v; want allowed=%v with %q", v, tt.allowed, tt.want)
			}
			if strings.Contains(out, egressTestKey) {
				t.Fatal("the verdict carries the key")
			}
		})
	}
	if _, err := s.ExplainEgressJSON("alpha", "GET", "pypi.org"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a URL without scheme: %v, want invalid argument", err)
	}
	if _, err := s.ExplainEgressJSON("nope", "GET", "https://pypi.org/"); !errors.Is(err, ErrNotFound) {
		t.Errorf("an unknown agent: %v, want not found", err)
	}
}
