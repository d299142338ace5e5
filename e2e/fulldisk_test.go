package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/fulldisk"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// postRaw sends a signed message and returns the whole answer.
func (s *suite) postRaw(t *testing.T, msg map[string]string) (int, http.Header, string) {
	t.Helper()
	body, _ := json.Marshal(msg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := s.Post(ctx, "hooks", []byte(secret), body)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestAFullIntakeDiskAnswers503LosesNothingAcceptedAndResumesWhenSpaceReturns(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	dir := suiteDir(t)
	// intake's own state directory ($BERTH_STATE_DIR/intake) is a small disk
	// of its own, mounted before intake starts.
	intakeDir := filepath.Join(dir, "state", "intake")
	fulldisk.MountAt(t, intakeDir, 8<<20)
	s := launchIn(t, dir, sink, suiteConfig([]agentSpec{{id: "ops"}}, sink.srv.URL+"/replies"), nil, secret)

	// Accepted before the disk fills; their runs and replies may be under
	// way while it is full.
	var accepted []string
	for i := range 3 {
		id := fmt.Sprintf("before-%d", i)
		if status, got := s.post(t, map[string]string{"id": id, "channel": "ops", "author": "a", "text": "/sh echo " + id}); status != http.StatusAccepted || got != id {
			t.Fatalf("POST %s: %d %q", id, status, got)
		}
		accepted = append(accepted, id)
	}

	filler := fulldisk.Fill(t, intakeDir)
	// intake.db may still fit a few messages into pages its file already
	// has; those are accepted like any other. The first that does not fit
	// is refused.
	var refused string
	for i := 0; refused == ""; i++ {
		if i == 200 {
			t.Fatal("200 POSTs on a full disk were all accepted")
		}
		id := fmt.Sprintf("during-%03d", i)
		status, header, body := s.postRaw(t, map[string]string{"id": id, "channel": "ops", "author": "a", "text": "/sh echo " + id})
		switch status {
		case http.StatusAccepted:
			accepted = append(accepted, id)
		case http.StatusServiceUnavailable:
			refused = id
			if !strings.Contains(body, "state disk is full") || header.Get("Retry-After") == "" {
				t.Errorf("503 on a full disk: Retry-After %q, body %s", header.Get("Retry-After"), body)
			}
		default:
			t.Fatalf("POST %s on a full disk: %d %s", id, status, body)
		}
	}
	log, _ := os.ReadFile(s.IntakeLog)
	if !strings.Contains(string(log), "state disk is full") || !strings.Contains(string(log), intakeDir) {
		t.Errorf("intake's log does not say its state disk %s is full", intakeDir)
	}

	filler.Free(t)
	status, got := s.post(t, map[string]string{"id": refused, "channel": "ops", "author": "a", "text": "/sh echo " + refused})
	if status != http.StatusAccepted || got != refused {
		t.Fatalf("POST %s again once there is room: %d %q", refused, status, got)
	}
	accepted = append(accepted, refused)

	replies := sink.wait(t, 3*time.Minute, accepted...)
	for _, id := range accepted {
		if txt := text(replies[id]); !strings.Contains(txt, id) {
			t.Errorf("reply to %s is %q", id, txt)
		}
	}
	// Each message ran once.
	runs := s.listRuns(t, busapi.ListFilter{Agent: "ops", Limit: 500})
	perMessage := map[string]int{}
	for _, r := range runs {
		perMessage[r.MessageID]++
	}
	for _, id := range accepted {
		if n := perMessage[busapi.MessageKey("hooks", id)]; n != 1 {
			t.Errorf("message %s ran %d times, want once", id, n)
		}
	}
}
