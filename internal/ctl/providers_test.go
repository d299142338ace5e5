package ctl

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestProvidersTestReportsReachabilityAuthModelAndLatency(t *testing.T) {
	t.Setenv("GOOD_KEY", "sk-good")
	t.Setenv("BAD_KEY", "sk-bad")
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
	cfg := filepath.Join(t.TempDir(), "berth.toml")
	provider := func(name, model, keyEnv string) string {
		return fmt.Sprintf("[providers.%s]\nkind = \"openai\"\nbase_url = %q\nmodel = %q\napi_key_env = %q\n\n", name, srv.URL+"/v1", model, keyEnv)
	}
	text := "[providers]\nprimary = \"good\"\n\n" + provider("good", "m", "GOOD_KEY") + provider("badkey", "m", "BAD_KEY") +
		provider("nomodel", "missing", "GOOD_KEY") + provider("nokey", "m", "UNSET_KEY_FOR_TEST") +
		"[providers.down]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n\n[[agents]]\nid = \"a\"\n"
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}

	var out, errOut bytes.Buffer
	code := Main([]string{"providers", "test", "--config", cfg}, &out, &errOut)
	if code != ExitFailed {
		t.Errorf("exit code = %d, want %d (some providers fail)", code, ExitFailed)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = line
		}
	}
	for name, want := range map[string]string{"good": " ok ", "badkey": "auth failed", "nomodel": "model not found", "nokey": "UNSET_KEY_FOR_TEST is not set", "down": "unreachable"} {
		if !strings.Contains(rows[name], want) {
			t.Errorf("row of %s = %q, want %q\n%s", name, rows[name], want, out.String())
		}
	}
	if strings.Contains(out.String()+errOut.String(), "sk-bad") {
		t.Errorf("a key was printed:\n%s%s", out.String(), errOut.String())
	}

	out.Reset()
	if code := Main([]string{"providers", "test", "--config", cfg, "good"}, &out, &errOut); code != ExitOK || !strings.Contains(out.String(), "ms") {
		t.Errorf("testing only the good provider: exit %d\n%s", code, out.String())
	}
}
