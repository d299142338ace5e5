package scheduler

import (
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

const githubTestToken = "ghp_scheduler_test_SECRET_0815"

func TestEgressASecretReachesItsHostFromARealSandboxWhichNeverHoldsIt(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("curl")
	testenv.Need(t, err == nil, "curl is not installed")
	agentBin, proxyBin := egressBinaries(t)
	model := fakeModel(t)
	// A fake GitHub API that answers only with the token berth adds. Its
	// certificate (httptest's, for 127.0.0.1) is what the proxy verifies,
	// through the scheduler's SSL_CERT_FILE.
	github := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+githubTestToken {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `{"login":"berth-bot"}`)
	}))
	t.Cleanup(github.Close)
	caDir := sharedStateDir(t)
	caFile := filepath.Join(caDir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: github.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(github.Listener.Addr().String())

	cfg := egressConfig(agentBin, proxyBin, model.URL)
	cfg.Agents[0].Egress.Allow = []string{"127.0.0.1:" + port}
	cfg.EgressSecrets = []config.EgressSecret{{Name: "github", Env: "GITHUB_TOKEN", Hosts: []string{"127.0.0.1"}, Header: "Authorization", Format: "Bearer {}"}}
	s, err := New(cfg, sharedStateDir(t), Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv: func(k string) string {
			return map[string]string{"OPENAI_API_KEY": egressTestKey, "GITHUB_TOKEN": githubTestToken, "SSL_CERT_FILE": caFile}[k]
		},
		Logger: quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	id := submit(t, s, "m1", "alpha", "text", "curl-verified https://127.0.0.1:"+port+"/user")
	r, _ := s.GetRun(id)
	res, _, err := s.runOnce(t.Context(), r, cfg)
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	rep := decodeReport(t, res.Result)
	if len(rep.Curl) != 1 || rep.Curl[0] != `{"login":"berth-bot"} [200]` {
		t.Fatalf("curl from the sandbox: %q; want the API's answer, over TLS the sandbox verified", rep.Curl)
	}
	if strings.Contains(rep.Stdin, githubTestToken) || strings.Contains(strings.Join(rep.Env, "\n"), githubTestToken) {
		t.Fatal("the token reached the sandbox")
	}
	var recorded bool
	for _, d := range res.Egress {
		recorded = recorded || (d.Rule == "secret github" && d.Allowed && d.Path == "/user")
	}
	if !recorded {
		t.Errorf("decisions %+v; want the call under its secret", res.Egress)
	}
}
