package boltstore

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DiskFullError is a commit refused because the filesystem that holds the
// database has no room left (ENOSPC) or its owner's quota is used up
// (EDQUOT). Nothing of the commit is stored: bbolt rolls the transaction
// back, its earlier commits stay intact, and the next commit made once
// there is room succeeds.
type DiskFullError struct {
	Dir  string // the directory of the database
	Free uint64 // bytes available to the daemon on that filesystem, when it failed
	Err  error  // bbolt's error
}

func (e *DiskFullError) Error() string {
	return fmt.Sprintf("state disk is full: %s has %s free: %v", e.Dir, humanBytes(e.Free), e.Err)
}

func (e *DiskFullError) Unwrap() error { return e.Err }

// IsDiskFull reports whether err is a write refused for want of space or
// quota.
func IsDiskFull(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := errors.AsType[*DiskFullError](err); ok {
		return true
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	// bbolt formats the errors of growing the file with %s ("file resize
	// error: no space left on device"), which drops the errno.
	msg := err.Error()
	return strings.Contains(msg, syscall.ENOSPC.Error()) || strings.Contains(msg, syscall.EDQUOT.Error())
}

// FreeBytes is the space available to unprivileged writers on the
// filesystem that holds dir.
func FreeBytes(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("cannot read free space of %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// DiskFullLogInterval is the most often a committer logs that its disk is
// still full: a storm of refused requests makes one line a minute, not one
// per request.
const DiskFullLogInterval = time.Minute

// diskWatch is a committer's memory of its disk being full: the first
// refusal is logged at once, later ones once per DiskFullLogInterval with
// how many writes were refused meanwhile, and the first commit that
// succeeds afterwards says that writing resumed.
type diskWatch struct {
	mu       sync.Mutex
	log      *slog.Logger
	full     *DiskFullError // the last refusal while full; nil while writes succeed
	since    time.Time      // when the disk was found full
	loggedAt time.Time
	refused  int // writes refused since the last line
}

// refusedWrites notes that n writes were refused by e and logs when due.
// It does no I/O but the log line.
func (w *diskWatch) refusedWrites(e *DiskFullError, n int) {
	w.mu.Lock()
	now := time.Now()
	first := w.full == nil
	if first {
		w.since = now
	}
	w.full = e
	w.refused += n
	due := first || now.Sub(w.loggedAt) >= DiskFullLogInterval
	refused, since, log := w.refused, w.since, w.log
	if due {
		w.loggedAt, w.refused = now, 0
	}
	w.mu.Unlock()
	if due && log != nil {
		log.Error("state disk is full; new input is refused until space returns",
			"state_dir", e.Dir, "free_bytes", e.Free, "refused_writes", refused,
			"full_since", since.UTC().Format(time.RFC3339), "err", e.Err)
	}
}

// committed notes a successful commit and says so once after the disk was
// full.
func (w *diskWatch) committed() {
	w.mu.Lock()
	was := w.full
	refused, since, log := w.refused, w.since, w.log
	w.full, w.refused = nil, 0
	w.mu.Unlock()
	if was != nil && log != nil {
		free, _ := FreeBytes(was.Dir)
		log.Info("state disk has room again; writes resumed",
			"state_dir", was.Dir, "free_bytes", free, "refused_writes", refused,
			"full_for", time.Since(since).Round(time.Second).String())
	}
}

func (w *diskWatch) current() *DiskFullError {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.full
}
