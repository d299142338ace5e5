package e2e

import (
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

// Live progress through the real daemons (issue 26, ADR 27): berth-agent's
// progress line for a tool call → the supervisor → the scheduler's
// RunProgress signal → intake → one Slack progress message in the thread,
// then the answer, then the progress message deleted; 👀 and ✅ on the
// message. The command's assignment (a secret, say) is never shown.
func TestPlatformSlackLiveProgressAndReactionsThroughTheDaemons(t *testing.T) {
	t.Parallel()
	fake, s, ctx := startSlackPlatform(t, "xapp-1-e2e-progress-app", "xoxb-e2e-progress-bot", "progress = \"edit\"\nreactions = true\n")
	o := fake.Options()
	const ts = "1700000001.000001"
	const secretish = "progress-hunter2"
	// The sleep keeps the run going until intake has shown the progress.
	ev := slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE",
		Text: "/sh PASSWORD=" + secretish + " sleep 3 && echo progress-answer", TS: ts, Team: o.TeamID}
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	var progressTS string
	if err := fake.WaitProgress(ctx, "the progress message", func(posts []slacktest.Post, _ []slacktest.Edit, _ []slacktest.Reaction) bool {
		for _, p := range posts {
			if p.ThreadTS == ts && strings.HasPrefix(p.Text, "running `sleep`") {
				progressTS = p.TS
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("%v; posts %+v", err, fake.Posts())
	}
	if err := fake.WaitProgress(ctx, "the answer, the progress message deleted and ✅", func(posts []slacktest.Post, edits []slacktest.Edit, rx []slacktest.Reaction) bool {
		answered := slices.ContainsFunc(posts, func(p slacktest.Post) bool { return p.ThreadTS == ts && strings.Contains(p.Text, "progress-answer") })
		deleted := slices.ContainsFunc(edits, func(e slacktest.Edit) bool { return e.Deleted && e.TS == progressTS })
		done := slices.Contains(rx, slacktest.Reaction{Channel: "C0CHAN", Timestamp: ts, Name: "white_check_mark"})
		return answered && deleted && done
	}); err != nil {
		t.Fatalf("%v; posts %+v, edits %+v, reactions %+v", err, fake.Posts(), fake.Edits(), fake.Reactions())
	}
	if rx := fake.Reactions(); len(rx) != 2 || rx[0].Name != "eyes" {
		t.Fatalf("reactions = %+v, want 👀 then ✅", rx)
	}
	for _, p := range fake.Posts() {
		if strings.Contains(p.Text, secretish) && p.TS == progressTS {
			t.Fatalf("the progress message shows the command's assignment: %q", p.Text)
		}
	}
	for _, e := range fake.Edits() {
		if strings.Contains(e.Text, secretish) {
			t.Fatalf("a progress edit shows the command's assignment: %q", e.Text)
		}
	}
	if n := fake.Overruns(); n != 0 {
		t.Fatalf("%d progress calls came within a second of the last on the channel", n)
	}
	s.settle(t)
}
