package isolation_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/isolation"
)

func TestEgressRulesMatchHostsPortsAndMethods(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, rule, method, host string
		port                     int
		want                     bool
	}{
		{"A_bare_host_allows_HTTPS", "pypi.org", "CONNECT", "pypi.org", 443, true},
		{"A_bare_host_allows_HTTP", "pypi.org", "GET", "PyPI.org.", 80, true},
		{"A_bare_host_refuses_other_ports", "pypi.org", "CONNECT", "pypi.org", 22, false},
		{"A_port_is_the_only_port", "github.com:443", "CONNECT", "github.com", 80, false},
		{"A_glob_matches_subdomains", "*.debian.org", "GET", "deb.debian.org", 80, true},
		{"A_glob_matches_deeper_subdomains", "*.debian.org", "GET", "a.b.debian.org", 80, true},
		{"A_glob_does_not_match_the_domain_itself", "*.debian.org", "GET", "debian.org", 80, false},
		{"A_glob_does_not_match_a_lookalike", "*.debian.org", "GET", "evildebian.org", 80, false},
		{"Methods_restrict_plain_HTTP", "GET,HEAD files.example", "POST", "files.example", 80, false},
		{"Methods_allow_what_they_list", "GET,HEAD files.example", "head", "files.example", 80, true},
		{"A_method_rule_without_CONNECT_refuses_tunnels", "GET files.example", "CONNECT", "files.example", 443, false},
		{"An_IP_rule_matches_that_IP", "10.0.0.5:8080", "GET", "10.0.0.5", 8080, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := isolation.ParseEgressRule(tt.rule)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Matches(tt.method, tt.host, tt.port); got != tt.want {
				t.Fatalf("%q matches %s %s:%d = %v, want %v", tt.rule, tt.method, tt.host, tt.port, got, tt.want)
			}
		})
	}
}

func TestBadEgressRulesAreRefusedWithAReason(t *testing.T) {
	t.Parallel()
	for rule, want := range map[string]string{
		"https://pypi.org/":  "names a host, not a URL",
		"FETCH pypi.org":     `"FETCH" is not an HTTP method`,
		"pypi.org:0":         "is not 1-65535",
		"py*pi.org":          "is not a host name",
		"a b c":              "want",
		"":                   "want",
		"exa mple.org:443 x": "want",
		"-bad-.example":      "is not a host name",
	} {
		if _, err := isolation.ParseEgressRule(rule); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseEgressRule(%q) = %v, want an error with %q", rule, err, want)
		}
	}
}

func TestOnlyAnExactRuleNamesAHost(t *testing.T) {
	t.Parallel()
	star, _ := isolation.ParseEgressRule("*")
	glob, _ := isolation.ParseEgressRule("*.internal")
	exact, _ := isolation.ParseEgressRule("intake.internal:8470")
	if star.Names("intake.internal") || glob.Names("intake.internal") || !exact.Names("Intake.Internal") {
		t.Fatal("only an exact rule may name a host (and so reach an internal address)")
	}
}
