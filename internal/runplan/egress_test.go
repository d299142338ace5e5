package runplan_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

func TestARunWithoutANetworkOfItsOwnLeavesOnlyThroughItsEgressSocket(t *testing.T) {
	t.Parallel()
	env := map[string]string{"CLOUD_KEY": secret}
	cfg := testConfig(t, opsWithoutNetwork+`egress.allow = ["pypi.org", "GET deb.example.org:8080"]

[[agents]]
id = "boxed" # a container with network none
provider = "cloud"
`)
	tests := []struct {
		name  string
		agent string
		check func(t *testing.T, p isolation.Plan, host runplan.HostFacts)
	}{
		{"A_landlock_run_gets_an_empty_namespace_a_socket_and_the_proxy_port_only", "ops", func(t *testing.T, p isolation.Plan, host runplan.HostFacts) {
			e := p.Egress
			if p.Network.Allowed || p.Policy.Network || e == nil {
				t.Fatalf("network %+v policy network %v egress %+v; want none and an egress plan", p.Network, p.Policy.Network, e)
			}
			if want := filepath.Join(host.StateDir, "egress", "r1", "egress.sock"); e.Socket != want || e.SandboxSocket != want {
				t.Errorf("socket %q (sandbox %q), want %q", e.Socket, e.SandboxSocket, want)
			}
			if !slices.Equal(p.Policy.ConnectPorts, []uint16{isolation.EgressProxyPort}) || e.ProxyAddr != "127.0.0.1:3128" {
				t.Errorf("connect ports %v proxy %q; want only the in-sandbox proxy", p.Policy.ConnectPorts, e.ProxyAddr)
			}
			if len(e.Providers) != 1 || e.Providers[0].BaseURL != "http://127.0.0.1:9/v1" || e.Providers[0].Model != "m" {
				t.Errorf("providers %+v; want cloud's endpoint and model", e.Providers)
			}
			if len(e.Allow) != 2 || e.Allow[1].Port != 8080 || !slices.Equal(e.Allow[1].Methods, []string{"GET"}) {
				t.Errorf("allow %+v", e.Allow)
			}
			if e.Proxy.Binary != "/usr/libexec/berth/berth-egress" || e.Proxy.User != "daemon" {
				t.Errorf("proxy %+v", e.Proxy)
			}
		}},
		{"A_container_run_gets_its_socket_directory_bind_mounted", "boxed", func(t *testing.T, p isolation.Plan, host runplan.HostFacts) {
			if p.Egress == nil || p.Network.Mode != "none" {
				t.Fatalf("egress %+v network %+v", p.Egress, p.Network)
			}
			want := isolation.Mount{Source: filepath.Join(host.StateDir, "egress", "r1"), Target: "/run/berth-egress", ReadOnly: true}
			if !slices.Contains(p.Mounts, want) || p.Egress.SandboxSocket != "/run/berth-egress/egress.sock" {
				t.Errorf("mounts %+v sandbox socket %q; want %+v", p.Mounts, p.Egress.SandboxSocket, want)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host := facts(t, env)
			host.EgressUser = &isolation.RunUser{Name: "daemon", UID: 1, GID: 1}
			p, err := runplan.Compile(cfg, tc.agent, "r1", host)
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			tc.check(t, p, host)
			// What the agent reads on stdin: no key, its providers behind the proxy.
			in, err := isolation.Spec{Plan: p, EgressToken: "tok-0123456789abcdef"}.Input()
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(in), secret) {
				t.Fatalf("the request on stdin holds the key: %s", in)
			}
			var req agentproto.Request
			json.Unmarshal(in, &req)
			if req.Provider.Key != "" || req.Provider.BaseURL != "http://127.0.0.1:3128/providers/cloud" || !req.Provider.Proxied || req.Provider.Endpoint != "http://127.0.0.1:9/v1" {
				t.Errorf("provider on stdin %+v; want no key and the proxy's URL", req.Provider)
			}
			if req.Egress == nil || req.Egress.Token != "tok-0123456789abcdef" || req.Egress.Socket != p.Egress.SandboxSocket {
				t.Errorf("egress on stdin %+v", req.Egress)
			}
		})
	}
}

func TestOnlyAnAdminsOptInGivesADirectNetworkAndTheKeyOnStdin(t *testing.T) {
	t.Parallel()
	host := facts(t, map[string]string{"CLOUD_KEY": secret})
	p, err := runplan.Compile(testConfig(t), "ops", "r1", host) // allow_network = true
	if err != nil {
		t.Fatal(err)
	}
	if p.Egress != nil || !p.Network.Allowed {
		t.Fatalf("egress %+v network %+v; want a direct network and no proxy", p.Egress, p.Network)
	}
	in, _ := isolation.Spec{Plan: p}.Input()
	if !strings.Contains(string(in), secret) {
		t.Error("a direct-network run must still get its key on stdin")
	}
	e, err := runplan.Explain(testConfig(t), "ops", host)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.Why["network"], "DIRECT and unfiltered") || !strings.Contains(e.Why["egress"], "direct network") {
		t.Errorf("why network %q egress %q; want the opt-in said loudly", e.Why["network"], e.Why["egress"])
	}
}

func TestARunWithNothingToReachGetsNoProxy(t *testing.T) {
	t.Parallel()
	p, err := runplan.Compile(testConfig(t), "docs", "r1", facts(t, nil)) // local provider, no rules
	if err != nil {
		t.Fatal(err)
	}
	if p.Egress != nil || len(p.Policy.ConnectPorts) != 0 {
		t.Fatalf("egress %+v connect ports %v; want none", p.Egress, p.Policy.ConnectPorts)
	}
}

func TestExplainShowsTheEgressSectionWithoutKeys(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, opsWithoutNetwork+`egress.allow = ["pypi.org"]`)
	e, err := runplan.Explain(cfg, "ops", facts(t, map[string]string{"CLOUD_KEY": secret}))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(e)
	if strings.Contains(string(data), secret) {
		t.Fatal("the explanation holds the key")
	}
	if e.Plan.Egress == nil || !strings.Contains(e.Why["egress"], "pypi.org") || !strings.Contains(e.Why["egress"], `cloud at http://127.0.0.1:9/v1 with model "m"`) {
		t.Fatalf("egress %+v why %q", e.Plan.Egress, e.Why["egress"])
	}
	if len(e.Problems) != 0 {
		t.Errorf("problems %q", e.Problems)
	}
}

func TestTheProxyNeverRunsAsTheRunUser(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, opsWithoutNetwork)
	host := facts(t, map[string]string{"CLOUD_KEY": secret})
	host.EgressUser = host.RunUser
	if _, err := runplan.Compile(cfg, "ops", "r1", host); err == nil || !strings.Contains(err.Error(), "must be another user") {
		t.Fatalf("Compile = %v, want the egress user refused", err)
	}
}

func TestEgressSecretsApplyToHostsTheAgentMayReachAndNeverShow(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, opsWithoutNetwork+`egress.allow = ["api.github.com", "pypi.org"]

[[egress.secrets]]
name = "github"
env = "GITHUB_TOKEN"
hosts = ["api.github.com", "github.com"]

[[egress.secrets]]
name = "registry"
env = "REGISTRY_TOKEN"
hosts = ["registry.example"]
header = "X-Token"
format = "{}"

[[egress.secrets]]
name = "deploy"
file = "/etc/berth/deploy.token"
hosts = ["deploy.example"]
`)
	const token = "ghp_runplan_SECRET_42"
	host := facts(t, map[string]string{"CLOUD_KEY": secret, "GITHUB_TOKEN": token})
	p, err := runplan.Compile(cfg, "ops", "r1", host)
	if err != nil {
		t.Fatal(err)
	}
	e := p.Egress
	if len(e.Secrets) != 1 || e.Secrets[0].Name != "github" || !slices.Equal(e.Secrets[0].Hosts, []string{"api.github.com"}) || e.Secrets[0].Value != token {
		t.Fatalf("secrets %+v; want github for api.github.com only (github.com has no rule, registry neither)", e.Secrets)
	}
	if !slices.Contains(p.Policy.AllowRead, filepath.Join(host.StateDir, "egress", "r1")) {
		t.Errorf("the run's egress directory (its CA bundle) is not readable: %v", p.Policy.AllowRead)
	}
	if !slices.Contains(p.Policy.Deny, "/etc/berth/deploy.token") {
		t.Errorf("a secret file is not denied to the agent: %v", p.Policy.Deny)
	}
	if want := filepath.Join(host.StateDir, "egress", "r1", "ca.pem"); e.CABundle != want || e.SandboxCABundle != want {
		t.Errorf("CA bundle %q (sandbox %q), want %q", e.CABundle, e.SandboxCABundle, want)
	}
	in, _ := isolation.Spec{Plan: p, EgressToken: "tok-0123456789abcdef"}.Input()
	if strings.Contains(string(in), token) || !strings.Contains(string(in), `"ca_bundle":"`+e.SandboxCABundle+`"`) {
		t.Fatalf("stdin: the secret must be absent and the bundle named: %s", in)
	}
	ex, err := runplan.Explain(cfg, "ops", host)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(ex)
	if strings.Contains(string(data), token) || !strings.Contains(ex.Why["egress"], "secret github is added as Authorization for api.github.com") {
		t.Fatalf("explain: %s", data)
	}
	missing := facts(t, map[string]string{"CLOUD_KEY": secret})
	if _, err := runplan.Compile(cfg, "ops", "r1", missing); err == nil || !strings.Contains(err.Error(), "GITHUB_TOKEN is not set") {
		t.Fatalf("Compile without the secret's value = %v, want it refused", err)
	}
}

func TestAnEgressSocketPathTooLongForAUnixAddressIsAProblemNamingIt(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, opsWithoutNetwork+`egress.allow = ["pypi.org"]`)
	host := facts(t, map[string]string{"CLOUD_KEY": secret})
	host.StateDir = "/var/lib/" + strings.Repeat("d", 60)
	host.EgressDir = ""
	e, err := runplan.Explain(cfg, "ops", host)
	if err != nil {
		t.Fatalf("Explain: %v", err)
	}
	found := false
	for _, p := range e.Problems {
		if strings.Contains(p, "over the 107 a Unix socket address holds") {
			found = true
		}
	}
	if !found {
		t.Fatalf("problems %q: want one naming the socket path that is too long", e.Problems)
	}
}

func TestAskRulesAloneGiveTheRunAProxyAndExplainShowsThem(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "[[agents]]\nid = \"docs\"\n[agents.egress]\nask = [\"*.example.com\", \"POST api.stripe.com\"]\napproval_timeout = \"90s\"\n")
	e, err := runplan.Explain(cfg, "docs", facts(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	eg := e.Plan.Egress
	if eg == nil || len(eg.Ask) != 2 || eg.Ask[1].Raw != "POST api.stripe.com" || eg.ApprovalTimeout != 90*time.Second || len(eg.Allow) != 0 {
		t.Fatalf("egress plan %+v, want the two ask rules within 1m30s and no allow rule", eg)
	}
	why := e.Why["egress"]
	if !strings.Contains(why, "[agents.egress] ask: *.example.com, POST api.stripe.com") || !strings.Contains(why, "refused after 1m30s") {
		t.Fatalf("why egress %q, want the ask rules and their timeout", why)
	}
	data, _ := json.Marshal(e.Plan)
	if !strings.Contains(string(data), `"ask":[{"rule":"*.example.com"`) {
		t.Fatalf("plan JSON %s, want the ask rules", data)
	}
}

// A secret's host an ask rule names gets the secret (the proxy adds it only
// to what a person allowed), and an ask rule with methods needs the run's
// CA: its requests are judged inside the tunnel.
func TestAnAskedHostGetsItsSecretAndAMethodAskGetsTheCA(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, opsWithoutNetwork+`egress.ask = ["POST api.stripe.com"]

[[egress.secrets]]
name = "stripe"
env = "STRIPE_KEY"
hosts = ["api.stripe.com"]

[[egress.secrets]]
name = "github"
env = "GITHUB_TOKEN"
hosts = ["api.github.com"]
`)
	host := facts(t, map[string]string{"CLOUD_KEY": secret, "STRIPE_KEY": "sk_live_runplan", "GITHUB_TOKEN": "ghp_x"})
	p, err := runplan.Compile(cfg, "ops", "r1", host)
	if err != nil {
		t.Fatal(err)
	}
	e := p.Egress
	if len(e.Secrets) != 1 || e.Secrets[0].Name != "stripe" || !slices.Equal(e.Secrets[0].Hosts, []string{"api.stripe.com"}) {
		t.Fatalf("secrets %+v; want stripe's for its asked host only (no rule names github's)", e.Secrets)
	}
	bare := testConfig(t, opsWithoutNetwork+`egress.ask = ["POST api.example.com", "*.asked.example"]`)
	p, err = runplan.Compile(bare, "ops", "r1", host)
	if err != nil {
		t.Fatal(err)
	}
	if p.Egress.CABundle == "" || len(p.Egress.Secrets) != 0 {
		t.Errorf("a method ask rule's run: CA bundle %q, secrets %+v; want a CA (its https requests are judged inside) and no secret", p.Egress.CABundle, p.Egress.Secrets)
	}
	// The control: an ask rule without methods is decided at the CONNECT.
	p, err = runplan.Compile(testConfig(t, opsWithoutNetwork+`egress.ask = ["*.asked.example"]`), "ops", "r1", host)
	if err != nil {
		t.Fatal(err)
	}
	if p.Egress.CABundle != "" {
		t.Errorf("a run whose ask rules have no methods got a CA: %q", p.Egress.CABundle)
	}
}

func TestToolAsksAloneGiveTheRunAProxyThatJudgesThem(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "[[agents]]\nid = \"docs\"\n[agents.tools]\nask = [\"shell: git push *\", \"write_file\"]\n[agents.egress]\napproval_timeout = \"90s\"\n")
	e, err := runplan.Explain(cfg, "docs", facts(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	eg := e.Plan.Egress
	if eg == nil || len(eg.ToolAsk) != 2 || eg.ToolAsk[0].Pattern != "git push *" || eg.ToolAsk[1].Tool != "write_file" || eg.ApprovalTimeout != 90*time.Second {
		t.Fatalf("egress plan %+v, want the two tool rules within 1m30s", eg)
	}
	if why := e.Why["egress"]; !strings.Contains(why, "[agents.tools] ask: shell: git push *, write_file") || !strings.Contains(why, "denied after 1m30s") {
		t.Fatalf("why egress %q, want the tool asks and their timeout", why)
	}
	a, _ := cfg.Agent("docs")
	if tools := runplan.AgentTools(a); !slices.Equal(tools.Ask, []string{"shell: git push *", "write_file"}) {
		t.Fatalf("the request's tools %+v, want the ask rules as written", tools)
	}
}

func TestToolAsksWithoutAProxyAreExplainedAsDenied(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "[[agents]]\nid = \"docs\"\n[agents.tools]\nask = [\"shell\"]\n[agents.file_access]\nallow_network = true\n")
	e, err := runplan.Explain(cfg, "docs", facts(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if e.Plan.Egress != nil || !strings.Contains(e.Why["egress"], "no egress proxy to ask through, so every call they match is denied") {
		t.Fatalf("egress %+v, why %q; want no proxy and the tool asks denied", e.Plan.Egress, e.Why["egress"])
	}
}
