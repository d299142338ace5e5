package scheduler

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// ExplainEgress on the bus decides as the agent's proxy would: by the
// agent's rules, a bare host:port as a CONNECT, a direct network as
// unfiltered; questions it cannot decide are errors, and no key leaves.
func TestExplainEgressOverTheBusSaysWhetherARequestWouldPassAndWhy(t *testing.T) {
	t.Parallel()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	cfg := egressConfig("/nonexistent/berth-agent", "/nonexistent/berth-egress", "http://127.0.0.1:9")
	cfg.Agents[0].Egress.Allow = []string{"pypi.org", "github.com:22", "GET deb.example.org:8080"}
	direct := true
	cfg.Agents[1].FileAccess.AllowNetwork = &direct
	s, err := New(cfg, t.TempDir(), Options{Getenv: func(string) string { return egressTestKey }, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b := testbus.Start(t, testbus.Options{})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	obj := b.Conn(t).Object(bus.SchedulerName, bus.SchedulerPath)

	tests := []struct {
		name, agent, method, url string
		allowed                  bool
		want                     string
	}{
		{"An_https_URL_passes_by_the_rule_that_names_its_host", "alpha", "", "https://pypi.org/simple/", true, "allowed by rule pypi.org"},
		{"A_bare_host_and_port_is_decided_as_a_tunnel", "alpha", "CONNECT", "github.com:22", true, "allowed by rule github.com:22"},
		{"A_method_the_rule_does_not_list_is_refused_with_the_reason", "alpha", "POST", "http://deb.example.org:8080/upload", false, "no [agents.egress] allow rule matches POST deb.example.org:8080"},
		{"A_host_no_rule_names_is_refused_with_the_reason", "alpha", "GET", "https://exfil.example/", false, "no [agents.egress] allow rule matches CONNECT exfil.example:443"},
		{"A_direct_network_passes_unfiltered_and_says_so", "beta", "GET", "https://exfil.example/", true, "bypass the egress proxy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out string
			if err := obj.Call(bus.SchedulerInterface+".ExplainEgress", 0, tt.agent, tt.method, tt.url).Store(&out); err != nil {
				t.Fatalf("ExplainEgress: %v", err)
			}
			if strings.Contains(out, egressTestKey) {
				t.Fatalf("the verdict carries the provider key: %s", out)
			}
			v, err := busapi.EgressVerdictFromWire(out)
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if v.Allowed != tt.allowed || !strings.Contains(v.Reason, tt.want) || v.Agent != tt.agent || v.Network == "" {
				t.Fatalf("verdict %+v; want allowed=%v with %q", v, tt.allowed, tt.want)
			}
		})
	}

	errs := []struct {
		name, agent, method, url, want string
	}{
		{"A_URL_without_scheme_is_an_invalid_argument_that_says_what_to_write", "alpha", "GET", "pypi.org/simple", bus.ErrInvalidArgument},
		{"CONNECT_to_something_that_is_not_host_and_port_is_an_invalid_argument", "alpha", "CONNECT", "pypi.org/simple", bus.ErrInvalidArgument},
		{"An_unknown_agent_is_not_found", "nope", "GET", "https://pypi.org/", bus.ErrNotFound},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			var out string
			err := obj.Call(bus.SchedulerInterface+".ExplainEgress", 0, tt.agent, tt.method, tt.url).Store(&out)
			if bus.ErrorName(err) != tt.want {
				t.Fatalf("got %q, %v; want %s", out, err, tt.want)
			}
		})
	}

	t.Run("A_caller_who_is_neither_root_nor_admin_is_refused", func(t *testing.T) {
		testenv.NeedRoot(t) // busctl runs as nobody
		out := b.BusctlAs(t, "nobody", "call", bus.SchedulerName, string(bus.SchedulerPath), bus.SchedulerInterface, "ExplainEgress", "sss", "alpha", "GET", "https://pypi.org/")
		if strings.Contains(out, "allowed") || !strings.Contains(strings.ToLower(out), "denied") {
			t.Fatalf("busctl as nobody got %q, want access denied", out)
		}
	})
}
