package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// A shell command an [agents.tools] ask pattern matches waits in
// berth-agent while its run's proxy holds the ask; the conversation is
// asked; an admin's allow lets it run (its output reaches the reply, its
// file is made), a deny gives the model the denial naming the decider and
// the command never runs (its file is never made); a command no pattern
// matches runs unasked.
func TestToolAskAShellCommandWaitsForTheAdminsDecision(t *testing.T) {
	t.Parallel()
	for _, backend := range []struct{ name, extra string }{{"landlock", ""}, {"container", containerAgent}} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			if backend.name == "container" {
				testdocker.Engine(t)
			}
			toolAsksOn(t, backend.extra)
		})
	}
}

func toolAsksOn(t *testing.T, extra string) {
	testenv.NeedRoot(t)
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	tools := fmt.Sprintf("[agents.tools]\nask = [%q, %q]\n", "shell: touch *", "shell: git push *")
	cfg := askerConfig(sink, tools+extra)
	s := launch(t, sink, cfg, nil, secret)
	exists := func(name string) bool {
		_, err := os.Stat(s.workspace("asker", name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		return err == nil
	}

	t.Run("A_command_no_pattern_matches_runs_unasked", func(t *testing.T) {
		id := s.mustPost(t, "asker", "/sh echo unasked-$((6*7))")
		reply := s.sink.answer(t, time.Minute, id)
		if got := text(reply); reply["state"] != "succeeded" || !strings.Contains(got, "unasked-42") {
			t.Fatalf("reply: state %v %q, want the command's output", reply["state"], got)
		}
	})

	t.Run("A_tool_cannot_ask_in_berth-agent's_name", func(t *testing.T) {
		// Through the in-sandbox proxy, which adds the tools' token only.
		id := s.mustPost(t, "asker", `/sh busybox wget -q -O- --post-data='{"tool":"shell","command":"ls"}' http://127.0.0.1:3128/berth/tool-ask; echo wget-exit-$?`)
		reply := s.sink.answer(t, time.Minute, id)
		if got := text(reply); !strings.Contains(got, "403") || strings.Contains(got, "wget-exit-0") {
			t.Fatalf("reply: %q, want the proxy's 403", got)
		}
		list, err := s.scheduler(t).ListApprovals(context.Background(), "")
		if err != nil || len(list) != 0 {
			t.Fatalf("approvals %+v, %v: want none", list, err)
		}
	})

	t.Run("allowed", func(t *testing.T) {
		id := s.mustPost(t, "asker", "/sh touch allowed.txt && echo tool-ran-$((40+2))")
		ap := s.pendingApproval(t, "touch allowed.txt")
		if ap.Agent != "asker" || ap.What != "shell: touch allowed.txt && echo tool-ran-$((40+2))" || ap.Rule != "[agents.tools] shell: touch *" {
			t.Fatalf("pending approval %+v", ap)
		}
		question := s.sink.question(t, time.Minute, id)
		if q := text(question); !strings.Contains(q, "berthctl approvals allow "+ap.ID) || !strings.Contains(q, ap.What) {
			t.Errorf("the conversation was asked %q, want the command and how to decide it", q)
		}
		if exists("allowed.txt") {
			t.Fatal("the command ran before anybody decided")
		}
		if out, err := s.berthctl(t, "approvals", "allow", ap.ID); err != nil || !strings.Contains(out, "allowed") {
			t.Fatalf("berthctl approvals allow: %v\n%s", err, out)
		}
		reply := s.sink.answer(t, time.Minute, id)
		if got := text(reply); reply["state"] != "succeeded" || !strings.Contains(got, "tool-ran-42") {
			t.Fatalf("reply after the allow: state %v %q, want the command's output", reply["state"], got)
		}
		if !exists("allowed.txt") {
			t.Error("the allowed command's file is not in the workspace")
		}
		if calls := s.runRecord(t, reply).ToolCalls.Text; !strings.Contains(calls, `"approval":"approved by berthctl:root"`) {
			t.Errorf("the run record does not name the approver: %s", calls)
		}
	})

	t.Run("denied", func(t *testing.T) {
		// Spaces and a command before it do not get past the pattern.
		id := s.mustPost(t, "asker", "/sh   true;  touch   denied.txt && echo tool-ran-$((40+3))")
		ap := s.pendingApproval(t, "denied.txt")
		if ap.Rule != "[agents.tools] shell: touch *" {
			t.Fatalf("pending approval %+v, want the touch rule", ap)
		}
		if out, err := s.berthctl(t, "approvals", "deny", ap.ID); err != nil || !strings.Contains(out, "denied") {
			t.Fatalf("berthctl approvals deny: %v\n%s", err, out)
		}
		reply := s.sink.answer(t, time.Minute, id)
		got := text(reply)
		if !strings.Contains(got, "[shell error]") || !strings.Contains(got, "denied by berthctl:root") || strings.Contains(got, "tool-ran-43") {
			t.Errorf("reply after the deny: %q, want the model's tool error naming the decider", got)
		}
		if exists("denied.txt") {
			t.Error("the denied command ran: its file is in the workspace")
		}
		if out, err := s.berthctl(t, "approvals", "allow", ap.ID); err == nil {
			t.Errorf("a second decision was taken:\n%s", out)
		}
	})
}
