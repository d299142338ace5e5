package ctl

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// The check runs in the scheduler with its environment: a key only the
// scheduler has passes, a key only the admin's shell has does not.
func TestProvidersTestChecksWithTheSchedulersEnvironment(t *testing.T) {
	t.Setenv("ADMIN_ONLY_KEY", "sk-good")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Header.Get("Authorization") != "Bearer sk-good":
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":{"message":"Incorrect API key provided: sk-bad","type":"invalid_request_error","code":"invalid_api_key"}}`)
		case bytes.Contains(body, []byte(`"model":"missing"`)):
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"message":"The model missing does not exist","type":"invalid_request_error","code":"model_not_found"}}`)
		default:
			io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"OK"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}
	}))
	defer srv.Close()
	// The check is a run of berth-agent through its egress proxy, as root
	// runs it (as the agent's own user, the proxy as egress_user).
	testenv.NeedRoot(t)
	bins, err := testenv.OpenDir("berthctl-providers-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bins) })
	agentBin := buildStaticAgent(t, bins)
	proxyBin, err := testenv.Build(bins, "berth-egress", "github.com/berth-dev/berth/cmd/berth-egress")
	if err != nil {
		t.Fatal(err)
	}
	scheduler := fmt.Sprintf("[scheduler]\nagent_binary = %q\negress_binary = %q\negress_user = \"daemon\"\n\n", agentBin, proxyBin)
	provider := func(name, model, keyEnv string) string {
		return fmt.Sprintf("[providers.%s]\nkind = \"openai\"\nbase_url = %q\nmodel = %q\napi_key_env = %q\n\n", name, srv.URL+"/v1", model, keyEnv)
	}
	text := scheduler + "[providers]\nprimary = \"good\"\n\n" + provider("good", "m", "GOOD_KEY") + provider("badkey", "m", "BAD_KEY") +
		provider("nomodel", "missing", "GOOD_KEY") + provider("adminonly", "m", "ADMIN_ONLY_KEY") +
		"[providers.down]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n\n[[agents]]\nid = \"a\"\n"
	conn, _ := schedulerOnBus(t, text, map[string]string{"GOOD_KEY": "sk-good", "BAD_KEY": "sk-bad"})

	out, code := berthctl(conn, "providers", "test")
	if code != ExitFailed {
		t.Errorf("exit code = %d, want %d (some providers fail)", code, ExitFailed)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = line
		}
	}
	for name, want := range map[string]string{
		"good": " ok ", "badkey": "auth failed", "nomodel": "model not found", "down": "unreachable",
		"adminonly": "ADMIN_ONLY_KEY is not set in the scheduler's environment",
	} {
		if !strings.Contains(rows[name], want) {
			t.Errorf("row of %s = %q, want %q\n%s", name, rows[name], want, out)
		}
	}
	if strings.Contains(out, "sk-bad") || strings.Contains(out, "sk-good") {
		t.Errorf("a key was printed:\n%s", out)
	}

	if out, code := berthctl(conn, "providers", "test", "good"); code != ExitOK || !strings.Contains(out, "ms") || strings.Contains(out, "badkey") {
		t.Errorf("testing only the good provider: exit %d\n%s", code, out)
	}
	if out, code := berthctl(conn, "providers", "test", "nope"); code != ExitFailed || !strings.Contains(out, "not defined") {
		t.Errorf("an unknown provider: exit %d\n%s", code, out)
	}
}
