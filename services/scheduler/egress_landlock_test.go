package scheduler

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

const egressTestKey = "sk-egress-test-SECRET-4711"

var (
	egressBinsOnce            sync.Once
	egressAgentBin, egressBin string
	egressBinsErr             error
)

// egressBinaries builds the egress test agent and berth-egress (static, so
// the container backend can put them in an image) into a directory every
// user can enter.
func egressBinaries(t *testing.T) (agent, proxy string) {
	t.Helper()
	egressBinsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berth-egress-bins-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			egressBinsErr = err
			return
		}
		egressAgentBin, egressBin = filepath.Join(dir, "berth-agent"), filepath.Join(dir, "berth-egress")
		for out, pkg := range map[string]string{egressAgentBin: "../../agent/egress/testdata/egressagent", egressBin: "../../cmd/berth-egress"} {
			if _, err := testenv.BuildStatic(filepath.Dir(out), filepath.Base(out), pkg); err != nil {
				egressBinsErr = err
				return
			}
		}
	})
	if egressBinsErr != nil {
		t.Fatalf("cannot build the egress binaries: %v", egressBinsErr)
	}
	return egressAgentBin, egressBin
}

// fakeModel is an OpenAI-compatible server that answers only with the key.
func fakeModel(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+egressTestKey {
			http.Error(w, `{"error":{"message":"missing or wrong key"}}`, http.StatusUnauthorized)
			return
		}
		var body struct{ Model string }
		json.NewDecoder(r.Body).Decode(&body)
		io.WriteString(w, `{"choices":[{"message":{"content":"answer for `+body.Model+`"}}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// egressReport is what the egress test agent replies.
type egressReport struct {
	Stdin          string   `json:"stdin"`
	Env            []string `json:"env"`
	ProviderStatus int      `json:"provider_status"`
	ProviderBody   string   `json:"provider_body"`
	DirectErr      string   `json:"direct_err"`
	ProxyErr       string   `json:"proxy_err"`
	Curl           []string `json:"curl"`
	UDPErr         string   `json:"udp_err"`
	DNSErr         string   `json:"dns_err"`
}

func decodeReport(t *testing.T, res isolation.Result) egressReport {
	t.Helper()
	var rep egressReport
	if err := json.Unmarshal([]byte(res.Response.Reply), &rep); err != nil {
		t.Fatalf("reply %q: %v", res.Response.Reply, err)
	}
	return rep
}

func egressConfig(agentBin, proxyBin, modelURL string) *config.Config {
	cfg := testConfig(1)
	cfg.Providers = config.Providers{Primary: "openai", Entries: map[string]config.Provider{
		"openai": {Name: "openai", Kind: "openai", Model: "gpt-test", BaseURL: modelURL + "/v1", APIKeyEnv: "OPENAI_API_KEY"},
	}}
	cfg.Scheduler.AgentBinary = agentBin
	cfg.Scheduler.EgressBinary = proxyBin
	cfg.Scheduler.EgressUser = "daemon"
	return cfg
}

// runEgress submits one message and runs it through runOnce, which returns
// the egress decisions with the result.
func runEgress(t *testing.T, cfg *config.Config, stateDir string, backends map[string]isolation.Backend, text string) (isolation.Result, egressReport) {
	t.Helper()
	s, err := New(cfg, stateDir, Options{
		Backends: backends,
		Getenv: func(k string) string {
			if k == "OPENAI_API_KEY" {
				return egressTestKey
			}
			return ""
		},
		Logger: quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	id := submit(t, s, "m1", "alpha", "text", text)
	r, err := s.GetRun(id)
	if err != nil {
		t.Fatal(err)
	}
	res, _, err := s.runOnce(context.Background(), r, cfg)
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	rep := decodeReport(t, res.Result)
	if _, err := os.Stat(filepath.Join(s.stateDir, "egress", r.ID)); !os.IsNotExist(err) {
		t.Errorf("the run's egress directory outlived the run: %v", err)
	}
	return res.Result, rep
}

// directTraffic asks the test agent to try every way out but its socket:
// TCP to the fake model, UDP to a documentation address (routable from the
// host), a DNS lookup.
func directTraffic(tcpAddr string) string {
	return "direct " + tcpAddr + "\nudp 192.0.2.1:53\ndns localhost.berth-test.example"
}

func checkEgressRun(t *testing.T, res isolation.Result, rep egressReport, modelAddr string) {
	t.Helper()
	if rep.ProxyErr != "" || rep.ProviderStatus != 200 || !strings.Contains(rep.ProviderBody, "answer for gpt-test") {
		t.Fatalf("provider call from the sandbox: proxy %q, %d %q; want the model's answer", rep.ProxyErr, rep.ProviderStatus, rep.ProviderBody)
	}
	if strings.Contains(rep.Stdin, egressTestKey) {
		t.Fatal("the key is in the request on the agent's stdin")
	}
	if strings.Contains(strings.Join(rep.Env, "\n"), egressTestKey) {
		t.Fatal("the key is in the agent's environment")
	}
	if !strings.Contains(rep.Stdin, `"base_url":"http://127.0.0.1:3128/providers/openai"`) {
		t.Errorf("the agent's provider base URL is not the in-sandbox proxy: %s", rep.Stdin)
	}
	if rep.DirectErr == "" {
		t.Errorf("a direct connection to %s from the sandbox succeeded", modelAddr)
	}
	if rep.UDPErr == "" || rep.UDPErr == "sent" {
		t.Errorf("a UDP datagram left the sandbox (%q)", rep.UDPErr)
	}
	if rep.DNSErr == "" || rep.DNSErr == "resolved" {
		t.Errorf("the sandbox resolved a name itself (%q); only the proxy resolves", rep.DNSErr)
	}
	if len(res.Egress) != 1 || !res.Egress[0].Allowed || res.Egress[0].Rule != "provider openai" || res.Egress[0].Path != "/v1/chat/completions" || res.Egress[0].BytesDown == 0 {
		t.Errorf("egress decisions = %+v; want the one provider call", res.Egress)
	}
	if strings.Contains(res.Stderr, egressTestKey) {
		t.Error("the key is in the agent's stderr")
	}
}

func TestEgressALandlockRunCallsItsProviderWithoutEverHoldingTheKey(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	agentBin, proxyBin := egressBinaries(t)
	model := fakeModel(t)
	cfg := egressConfig(agentBin, proxyBin, model.URL)
	addr := model.Listener.Addr().String()
	res, rep := runEgress(t, cfg, sharedStateDir(t), map[string]isolation.Backend{landlock.Name: landlock.New()}, directTraffic(addr))
	checkEgressRun(t, res, rep, addr)
}

func TestEgressToolsInALandlockRunReachOnlyWhatTheRulesAllow(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("curl")
	testenv.Need(t, err == nil, "curl is not installed")
	agentBin, proxyBin := egressBinaries(t)
	model := fakeModel(t)
	index := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "simple index") }))
	t.Cleanup(index.Close)
	cfg := egressConfig(agentBin, proxyBin, model.URL)
	// The index is on loopback, so its rule must name it exactly; "*"
	// allows the internet on 80 and 443, never an internal address.
	cfg.Agents[0].Egress.Allow = []string{index.Listener.Addr().String(), "*"}
	_, modelPort, _ := strings.Cut(model.Listener.Addr().String(), ":")
	text := strings.Join([]string{
		"curl " + index.URL + "/simple/",
		"curl http://169.254.169.254/latest/meta-data/",
		"curl http://127.0.0.1:" + modelPort + "/v1/chat/completions",
	}, "\n")
	res, rep := runEgress(t, cfg, sharedStateDir(t), map[string]isolation.Backend{landlock.Name: landlock.New()}, text)
	if len(rep.Curl) != 3 {
		t.Fatalf("curl results %q (proxy %q)", rep.Curl, rep.ProxyErr)
	}
	wants := []string{
		"simple index [200]",
		"169.254.169.254 resolves to 169.254.169.254, a link-local address",
		"no [agents.egress] allow rule matches GET 127.0.0.1:" + modelPort,
	}
	for i, want := range wants {
		if !strings.Contains(rep.Curl[i], want) {
			t.Errorf("curl %d from the sandbox: %q, want %q", i, rep.Curl[i], want)
		}
	}
	for _, c := range rep.Curl[1:] {
		if !strings.Contains(c, "[403]") {
			t.Errorf("a refused request did not get 403: %q", c)
		}
	}
	var allowed, refused int
	for _, d := range res.Egress {
		if d.Allowed {
			allowed++
		} else {
			refused++
		}
	}
	// The provider call, the tunnel; the two refusals.
	if allowed != 2 || refused != 2 {
		t.Errorf("decisions %+v; want 2 allowed and 2 refused", res.Egress)
	}
}
