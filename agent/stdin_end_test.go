package agent_test

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
)

// A container's stdin ends milliseconds after its request arrived (the
// engine closes it): berth-agent confines itself as soon as the request is
// complete, without waiting for that end, and acts on the request only once
// stdin has ended; what follows the request is still refused.
func TestTheAgentConfinesItselfBeforeItsStdinEnds(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	f := newFixture(t)
	req, err := json.Marshal(f.request("hello there"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		after string // written after the confined line, before stdin ends
		code  int
	}{
		{"Answers_once_stdin_ends", "\n", agentproto.ExitOK},
		{"Refuses_what_follows_the_request", "{}", agentproto.ExitBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(agentBinary)
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stdout strings.Builder
			cmd.Stdout = &stdout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if _, err := stdin.Write(req); err != nil {
				t.Fatal(err)
			}
			confined := make(chan struct{})
			var log strings.Builder
			go func() {
				lines := bufio.NewScanner(stderr)
				for lines.Scan() {
					log.WriteString(lines.Text() + "\n")
					if strings.Contains(lines.Text(), `"confined with Landlock"`) {
						close(confined)
						break
					}
				}
				_, _ = io.Copy(io.Discard, stderr)
			}()
			select {
			case <-confined:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("berth-agent did not confine itself while its stdin was open; stderr:\n%s", log.String())
			}
			if stdout.Len() > 0 {
				t.Fatalf("berth-agent answered before its stdin ended: %s", stdout.String())
			}
			_, _ = io.WriteString(stdin, tc.after)
			stdin.Close()
			err = cmd.Wait()
			code := 0
			if exitErr, ok := err.(*exec.ExitError); ok {
				code = exitErr.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Fatalf("exit code %d, want %d; stdout %q", code, tc.code, stdout.String())
			}
			if tc.code == agentproto.ExitOK && !strings.Contains(stdout.String(), "you said: hello there") {
				t.Fatalf("stdout %q: want the reply", stdout.String())
			}
		})
	}
}
