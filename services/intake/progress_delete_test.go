package intake

import (
	"testing"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

// progressIndexed counts the progress messages intake.db still means to
// delete.
func progressIndexed(t *testing.T, s *Service) int {
	t.Helper()
	n := 0
	if err := s.store.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketProgress); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// A delete of the progress message that fails (Discord answers 500) is
// retried with the reply back-off until it is gone, and then forgotten.
func TestAFailedDeleteOfTheProgressMessageIsRetried(t *testing.T) {
	t.Parallel()
	fake, _, s, clock := progressDiscord(t, config.ProgressEdit, false)
	s.onRunProgress(progress(1, "running `make`"))
	fake.WaitPosts(t, 1)
	const id = "900000000000000001"
	eventually(t, "the progress message is indexed", func() bool { return progressIndexed(t, s) == 1 })

	fake.FailDeletes(2)
	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: "1000", Connector: "dc", State: "succeeded", Text: "done"}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	advanceUntil(t, clock, "the third delete", func() bool { return fake.Deleted(id) })
	if n := fake.FailedDeletes(); n != 2 {
		t.Fatalf("%d deletes failed, want 2 before the one that worked", n)
	}
	eventually(t, "the deleted message is forgotten", func() bool { return progressIndexed(t, s) == 0 })
	m, _, err := s.store.message("dc", "1000")
	if err != nil || m.ProgressMessage != "" {
		t.Fatalf("inbox entry keeps progress message %q (err %v)", m.ProgressMessage, err)
	}
}

// When every delete fails, the progress message stays indexed, and the
// next start of intake deletes it, since its answer was posted.
func TestAProgressMessageLeftBehindIsDeletedAtTheNextStart(t *testing.T) {
	t.Parallel()
	fake, d, s, clock := progressDiscord(t, config.ProgressEdit, false)
	s.onRunProgress(progress(1, "running `make`"))
	fake.WaitPosts(t, 1)
	const id = "900000000000000001"

	fake.FailDeletes(1000)
	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: "1000", Connector: "dc", State: "succeeded", Text: "done"}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	advanceUntil(t, clock, "every delete attempt", func() bool { return fake.FailedDeletes() == progressDeleteAttempts })
	eventually(t, "the reply is delivered", func() bool { _, out := s.store.pendingCounts(); return out == 0 })
	if n := progressIndexed(t, s); n != 1 {
		t.Fatalf("%d progress messages indexed after the deletes failed, want 1", n)
	}
	d.stop()
	if fake.Deleted(id) {
		t.Fatal("the progress message was deleted although every delete failed")
	}

	fake.FailDeletes(0)
	s = d.startOnClock(clockwork.NewFakeClock())
	fake.WaitFor(t, "the leftover progress message deleted", func() bool { return fake.Deleted(id) })
	eventually(t, "it is forgotten", func() bool { return progressIndexed(t, s) == 0 })
	if posts := fake.Posts(); len(posts) != 2 {
		t.Fatalf("posts = %+v, want the progress message and one answer: a restart posts nothing again", posts)
	}
}

// A run may report its first tool call before intake has recorded its
// hand-off (the report races Submit's answer and its commit); a run with
// one tool call reports nothing later, so that report is kept for the
// message and shown once the hand-off is recorded.
func TestAProgressReportThatArrivesBeforeTheHandOffIsRecordedIsShown(t *testing.T) {
	t.Parallel()
	fake, _, s, _ := progressDiscord(t, config.ProgressEdit, false)
	// Message 1001 will be run-2 (the counting submitter's second run).
	s.onRunProgress(busapi.RunProgress{RunID: "run-2", MessageKey: "dc/1001", Seq: 1, Text: "running `make`"})
	fake.MessageCreate(discordtest.MessageSpec{ID: "1001", Channel: progressChannel, Guild: progressGuild,
		Author: discordtest.User{ID: "500000000000000001", Username: "alice"}, Content: "build it"})
	posts := fake.WaitPosts(t, 1)
	if posts[0].Content != "running `make`" {
		t.Fatalf("posted %q, want the early report as the progress message", posts[0].Content)
	}
	s.progress.mu.Lock()
	left := len(s.progress.early)
	s.progress.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d early reports kept after their message started", left)
	}
}
