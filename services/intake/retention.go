package intake

import (
	"context"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

const (
	// defaultRetention and minRetention bound how long finished entries (and
	// with them the message ids that de-duplicate platform retries) are kept.
	defaultRetention = 72 * time.Hour
	minRetention     = 24 * time.Hour
	// retentionEvery is how often finished entries are pruned.
	retentionEvery = time.Hour
)

// retentionOf is [retention] delivered_hours, 72 h when unset, never less
// than 24 h: platforms retry events for hours, and a retry of a pruned
// message would run again.
func retentionOf(cfg *config.Config) time.Duration {
	d := cfg.Retention.Delivered
	if d == 0 {
		d = defaultRetention
	}
	return max(d, minRetention)
}

// retentionLoop prunes finished entries at start and then every hour.
func (s *Service) retentionLoop(ctx context.Context) {
	for {
		s.prune(ctx)
		next := s.clock.After(retentionEvery)
		s.notePass("retention", nil)
		select {
		case <-ctx.Done():
			return
		case <-next:
		}
	}
}

// prune deletes the inbox and outbox entries that finished (submitted,
// refused, delivered, failed) longer ago than the retention, in small
// transactions, and returns how many it deleted.
func (s *Service) prune(ctx context.Context) int {
	cutoff := s.clock.Now().Add(-time.Duration(s.retention.Load()))
	total := 0
	for ctx.Err() == nil {
		n, more, err := s.store.pruneFinished(cutoff)
		total += n
		if err != nil {
			s.log.Error("cannot prune finished messages and replies", "err", err)
			break
		}
		if !more {
			break
		}
	}
	if total > 0 {
		s.log.Info("pruned finished messages and replies", "count", total, "older_than", cutoff.UTC().Format(time.RFC3339))
	}
	if n := s.sweepReplyFiles(); n > 0 {
		s.log.Info("removed the files of finished replies", "count", n)
	}
	return total
}

// sweepReplyFiles removes the file directories that no pending reply names:
// a reply's files go when it is done, and this catches those a crash or a
// failed removal left behind.
func (s *Service) sweepReplyFiles() int {
	return s.replyFiles.sweep(func(dir string) bool {
		_, runID, ok := strings.Cut(dir, ".")
		if !ok {
			return false
		}
		r, found, err := s.store.reply(runID)
		if err != nil {
			return true // not knowing, keep it
		}
		return found && r.State == statePending && r.FilesDir == dir
	}, s.clock.Now(), s.log)
}
