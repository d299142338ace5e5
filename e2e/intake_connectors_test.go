package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
)

// startTwoConnectors starts a suite with two webhook connectors: "hooks",
// whose reply_url is the usual reply sink, and "stuck", whose reply_url
// accepts the connection and never answers.
func startTwoConnectors(t *testing.T) *suite {
	t.Helper()
	release := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(stuck.Close)
	sink := newReplySink(t)
	cfg := fmt.Sprintf(`[providers]
primary = "local"

[[agents]]
id = "ops"
max_iterations = 4

[intake]
default_agent = "ops"

[[connectors]]
id = "hooks"
type = "webhook"
secret = %q
reply_url = %q

[[connectors]]
id = "stuck"
type = "webhook"
secret = %q
reply_url = %q

[scheduler]
max_concurrent_runs = 4
default_timeout_seconds = 60
run_as = "nobody"
agent_binary = %q
`, secret, sink.srv.URL+"/replies", secret, stuck.URL+"/replies", filepath.Join(binDir, "berth-agent"))
	s := launch(t, sink, cfg, nil, secret)
	t.Cleanup(func() { close(release) }) // before the suite stops: nothing left hanging
	return s
}

func TestAPlatformThatNeverAnswersDoesNotDelayAnotherConnectorsReplies(t *testing.T) {
	t.Parallel()
	s := startTwoConnectors(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 3 {
		body, _ := json.Marshal(map[string]string{"id": fmt.Sprintf("stuck-%d", i), "channel": "ops", "author": "tester", "text": "hello"})
		resp, err := s.Post(ctx, "stuck", []byte(secret), body)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST to stuck: %d", resp.StatusCode)
		}
	}
	id := s.mustPost(t, "ops", "hello")
	// Intake gives each reply POST 30 s; three stuck replies posted one after
	// the other would hold this one back for 90 s.
	start := time.Now()
	s.sink.wait(t, 25*time.Second, id)
	t.Logf("the reply on hooks arrived after %v while stuck's platform hung", time.Since(start))
}

func TestIntakeAsItRunsAnswersBusctlAndRefusesMessagesItCouldNeverHandOn(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("busctl"); err != nil {
		t.Fatalf("busctl is needed: %v", err)
	}
	s := startTwoConnectors(t)

	t.Run("busctl_introspect_shows_the_interface", func(t *testing.T) {
		out, err := exec.Command("busctl", "--address="+s.Bus.Address, "introspect", bus.IntakeName, string(bus.IntakePath)).CombinedOutput()
		if err != nil || !strings.Contains(string(out), ".Deliver") || !strings.Contains(string(out), ".Connectors") {
			t.Fatalf("busctl introspect: %v\n%s", err, out)
		}
	})
	t.Run("A_NUL_in_the_text_is_refused_naming_the_field", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := s.Post(ctx, "hooks", []byte(secret), []byte(`{"id":"nul-1","channel":"ops","author":"tester","text":"a\u0000b"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(out.Error, "text contains a NUL") {
			t.Fatalf("POST with a NUL: %d %q, want 400 naming text", resp.StatusCode, out.Error)
		}
		if n := s.intakeStatus(t).InboxPending; n != 0 {
			t.Fatalf("InboxPending = %d, want 0", n)
		}
	})
	t.Run("Connectors_lists_both_webhooks_without_their_secret", func(t *testing.T) {
		list := s.intakeStatus(t).Connectors
		if len(list) != 2 || list[0].ID != "hooks" || list[1].ID != "stuck" || list[0].State != "http" {
			t.Fatalf("Connectors = %+v, want hooks and stuck in state http", list)
		}
		if strings.Contains(fmt.Sprintf("%+v", list), secret) {
			t.Fatalf("Connectors shows the webhook secret: %+v", list)
		}
	})
}
