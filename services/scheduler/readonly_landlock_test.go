package scheduler

import (
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// A read-only agent's tools read https through the run's proxy, which
// reads every request inside the tunnel with the run's CA (the plan gives
// the run one for its rules' hosts, and the sandbox trusts it); without
// read-only the same tunnel is passed through unread.
func TestEgressReadOnlyRunsReadEveryTunnel(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("curl")
	testenv.Need(t, err == nil, "curl is not installed")
	agentBin, proxyBin := egressBinaries(t)
	model := fakeModel(t)
	index := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "simple index") }))
	t.Cleanup(index.Close)
	// What the proxy verifies the index with (the scheduler's SSL_CERT_FILE).
	caFile := filepath.Join(sharedStateDir(t), "upstream-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: index.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"read-only", ""} {
		cfg := egressConfig(agentBin, proxyBin, model.URL)
		cfg.Agents[0].Egress.Allow = []string{index.Listener.Addr().String()}
		cfg.Agents[0].Egress.Mode = mode
		s, err := New(cfg, sharedStateDir(t), Options{
			Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
			Getenv: func(k string) string {
				return map[string]string{"OPENAI_API_KEY": egressTestKey, "SSL_CERT_FILE": caFile}[k]
			},
			Logger: quietLog,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		// Read-only: curl trusts the run's bundle only, and it verifies. The
		// control tunnels to the index itself, whose certificate no bundle has.
		verb := "curl-verified "
		if mode == "" {
			verb = "curl "
		}
		id := submit(t, s, "m1", "alpha", "text", verb+index.URL+"/simple/")
		r, _ := s.GetRun(id)
		res, _, err := s.runOnce(t.Context(), r, cfg)
		if err != nil {
			t.Fatalf("mode %q: run failed: %v (stderr %q)", mode, err, res.Stderr)
		}
		rep := decodeReport(t, res.Result)
		if len(rep.Curl) != 1 || !strings.Contains(rep.Curl[0], "simple index [200]") {
			t.Fatalf("mode %q: curl %q (proxy %q)", mode, rep.Curl, rep.ProxyErr)
		}
		var read bool
		for _, d := range res.Egress {
			read = read || d.Rule == "read-only" && d.Method == "GET" && d.Allowed
		}
		if read != (mode == "read-only") {
			t.Fatalf("mode %q: a GET read inside the tunnel = %v; decisions %+v", mode, read, res.Egress)
		}
	}
}
