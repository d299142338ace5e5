package runprep

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/isolation"
)

func TestSweepRemovesWhatIsNotOfALiveAttemptAndKeepsTheLiveOne(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	boxes := &recordingBackend{name: "container", run: "r1"}
	// One backend under two names is swept once.
	p := New(Options{StateDir: state, Logger: quietLog, Backends: map[string]isolation.Backend{"container": boxes, "also-container": boxes}})
	root := filepath.Join(state, "egress")
	dead := filepath.Join(root, isolation.AttemptName("r1", 0))
	live := filepath.Join(root, isolation.AttemptName("r1", 1))
	crashed := filepath.Join(root, "run-of-a-dead-scheduler")
	for _, d := range []string{dead, live, crashed} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p.Sweep(t.Context(), func(runID string, attempt int) bool { return runID == "r1" && attempt == 1 })
	for _, gone := range []string{dead, crashed} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", filepath.Base(gone), err)
		}
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live attempt's egress directory was removed: %v", err)
	}
	if len(boxes.said) != 1 || boxes.said[0] != [3]bool{false, true, false} {
		t.Errorf("the backend was swept %d times, told %v of attempts 0 to 2; want once, only attempt 1 live", len(boxes.said), boxes.said)
	}
}
