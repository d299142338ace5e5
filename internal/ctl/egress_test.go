package ctl

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/busapi"
)

const egressExplainConfig = sandboxConfig + `
[[agents]]
id = "fetcher"
[agents.file_access]
allow_network = false
[agents.egress]
allow = ["pypi.org", "GET files.example.org", "github.com:22"]
`

func TestEgressExplainSaysWhetherARequestWouldPassByWhichRuleOrWhyNot(t *testing.T) {
	t.Parallel()
	conn, _ := schedulerOnBus(t, egressExplainConfig, map[string]string{"CLOUD_KEY": sandboxSecret})
	tests := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"An_allowed_https_URL_exits_0_and_names_the_rule", []string{"fetcher", "https://pypi.org/simple/"}, ExitOK,
			[]string{"request:  GET https://pypi.org/simple/", "in a CONNECT tunnel", "verdict:  ALLOWED by rule pypi.org", "network:  none"}},
		{"A_refused_request_exits_1_with_the_reason_of_the_403", []string{"--method", "POST", "fetcher", "http://files.example.org/upload"}, ExitFailed,
			[]string{"verdict:  REFUSED", "reason:   no [agents.egress] allow rule matches POST files.example.org:80"}},
		{"Flags_may_follow_the_agent_and_URL", []string{"fetcher", "https://exfil.example/", "--method", "GET"}, ExitFailed,
			[]string{"no [agents.egress] allow rule matches CONNECT exfil.example:443"}},
		{"A_bare_host_and_port_is_asked_as_a_tunnel", []string{"fetcher", "github.com:22"}, ExitOK,
			[]string{"request:  CONNECT github.com:22", "ALLOWED by rule github.com:22"}},
		{"A_direct_network_passes_unfiltered_and_says_so", []string{"ops", "https://exfil.example/"}, ExitOK,
			[]string{"PASSES, unfiltered (DIRECT network", "network:  host"}},
		{"A_URL_without_scheme_exits_2_and_says_what_to_write", []string{"fetcher", "pypi.org/simple"}, ExitUsage,
			[]string{"has no scheme: say https://pypi.org/simple"}},
		{"An_unknown_agent_exits_2", []string{"nope", "https://pypi.org/"}, ExitUsage, []string{`unknown agent "nope"`}},
		{"A_missing_URL_is_a_usage_error", []string{"fetcher"}, ExitUsage, []string{"usage: berthctl egress explain"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, code := berthctl(conn, append([]string{"egress", "explain"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, sandboxSecret) {
				t.Errorf("output holds the provider key:\n%s", out)
			}
		})
	}
}

func TestEgressExplainJSONIsTheSchedulersVerdict(t *testing.T) {
	t.Parallel()
	conn, _ := schedulerOnBus(t, egressExplainConfig, nil)
	out, code := berthctl(conn, "egress", "explain", "--json", "fetcher", "https://pypi.org/")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	v, err := busapi.EgressVerdictFromWire(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !v.Allowed || v.Rule != "pypi.org" || v.Method != "GET" || v.Agent != "fetcher" || v.Network != "none" {
		t.Errorf("verdict %+v", v)
	}
}

// sandbox explain names the way out: the egress proxy for an agent without
// a network, and the direct network as an opt-in for one with it.
func TestSandboxExplainShowsTheEgressAndTheDirectNetworkOptIn(t *testing.T) {
	t.Parallel()
	conn, _ := schedulerOnBus(t, egressExplainConfig, map[string]string{"CLOUD_KEY": sandboxSecret})
	tests := []struct {
		name, agent string
		want        []string
		never       []string
	}{
		{"An_agent_without_network_shows_its_egress_rules", "fetcher",
			[]string{"egress:    through the run's socket", "[agents.egress] allow: pypi.org, GET files.example.org, github.com:22"}, []string{"DIRECT NETWORK"}},
		{"An_agent_with_a_direct_network_shows_the_opt_in", "ops",
			[]string{"DIRECT NETWORK: an admin's opt-in, logged on every run", "egress:    none: the run has a direct network"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, _ := berthctl(conn, "sandbox", "explain", tc.agent)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, n := range append(tc.never, sandboxSecret) {
				if strings.Contains(out, n) {
					t.Errorf("output holds %q:\n%s", n, out)
				}
			}
		})
	}
}
