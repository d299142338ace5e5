package boltstore

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// MaxGroup is the most writes one commit holds, so that a burst never
// builds one huge transaction.
const MaxGroup = 1024

// ErrClosed is what Write returns once the committer has stopped.
var ErrClosed = errors.New("database is closed")

// Committer is a database's only writer: concurrent writes wait in a queue
// while the previous commit is on its way to disk, then share the next
// transaction and its fsync, applied in the order the committer took them.
// A write returns only after the commit that holds it: nothing is
// acknowledged that is not on disk. There is no timer: a lone write is
// committed at once, and under load each commit takes everything that
// arrived during the one before. intake.db and scheduler.db both use it.
type Committer struct {
	db   *bolt.DB
	reqs chan *writeReq // buffered: its length is the writes waiting
	quit chan struct{}
	done chan struct{}
	once sync.Once

	// commitHook, when set (tests), commits in place of tx.Commit, to hold
	// or fail a commit; n is how many writes the commit holds.
	commitHook atomic.Pointer[func(tx *bolt.Tx, n int) error]
	// commits and writes count successful commits and the writes they held.
	commits, writes atomic.Uint64
	// disk remembers a full disk, for the log and for DiskFull.
	disk diskWatch
	// observe, when set (metrics), is told each commit's time and writes.
	observe atomic.Pointer[func(took time.Duration, writes int)]
}

type writeReq struct {
	fn  func(*bolt.Tx) error
	err chan error
}

// NewCommitter starts db's committer; Close stops it.
func NewCommitter(db *bolt.DB) *Committer {
	c := &Committer{
		db:   db,
		reqs: make(chan *writeReq, MaxGroup),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	go c.run()
	return c
}

// Write runs fn in a read-write transaction shared with other writers and
// returns once that transaction is committed (nil) or has failed. fn may be
// called more than once, each time in a fresh transaction (a group is
// applied again without a write whose fn failed), so it must set its
// results afresh on every call and have no other side effects. An fn that
// decides to write nothing (a refused request) should return nil and report
// its answer through its own variables: an error costs the rest of the
// group a second pass.
func (c *Committer) Write(fn func(*bolt.Tx) error) error {
	r := &writeReq{fn: fn, err: make(chan error, 1)}
	select {
	case c.reqs <- r:
	case <-c.quit:
		return ErrClosed
	}
	select {
	case err := <-r.err:
		return err
	case <-c.done:
		select {
		case err := <-r.err: // committed just before the committer stopped
			return err
		default:
			return ErrClosed
		}
	}
}

// Close commits what is queued, stops the committer and returns once it
// has.
func (c *Committer) Close() {
	c.once.Do(func() { close(c.quit) })
	<-c.done
}

// Stats are the successful commits and the writes they held.
func (c *Committer) Stats() (commits, writes uint64) {
	return c.commits.Load(), c.writes.Load()
}

// SetCommitObserver makes the committer tell fn how long each successful
// commit took (its fsyncs included) and how many writes it held; nil stops it.
func (c *Committer) SetCommitObserver(fn func(took time.Duration, writes int)) {
	if fn == nil {
		c.observe.Store(nil)
		return
	}
	c.observe.Store(&fn)
}

// SetLogger makes the committer log a full disk (at most once per
// DiskFullLogInterval) and its end; without it, it logs nothing.
func (c *Committer) SetLogger(log *slog.Logger) {
	c.disk.mu.Lock()
	c.disk.log = log
	c.disk.mu.Unlock()
}

// DiskFull is the last refusal of a full disk while the disk stays full
// (no commit has succeeded since), or nil.
func (c *Committer) DiskFull() *DiskFullError { return c.disk.current() }

// Waiting is how many writes wait for the next commit.
func (c *Committer) Waiting() int { return len(c.reqs) }

// SetCommitHook makes hook commit in place of tx.Commit (tests: hold or fail
// a commit); nil restores tx.Commit.
func (c *Committer) SetCommitHook(hook func(tx *bolt.Tx, n int) error) {
	if hook == nil {
		c.commitHook.Store(nil)
		return
	}
	c.commitHook.Store(&hook)
}

func (c *Committer) run() {
	defer close(c.done)
	group := make([]*writeReq, 0, MaxGroup)
	for {
		var first *writeReq
		select {
		case first = <-c.reqs:
		case <-c.quit:
			// Finish what was queued before the stop.
			for {
				select {
				case r := <-c.reqs:
					c.commitGroup(append(group[:0], r))
				default:
					return
				}
			}
		}
		group = append(group[:0], first)
	fill:
		for len(group) < MaxGroup {
			select {
			case r := <-c.reqs:
				group = append(group, r)
			default:
				break fill
			}
		}
		c.commitGroup(group)
	}
}

// commitGroup applies every write of group in one transaction, in order,
// and commits it. A write whose fn fails gets its error and the rest are
// applied again in a fresh transaction without it; a failed commit fails
// every write it held, and none of them is stored.
func (c *Committer) commitGroup(group []*writeReq) {
	live := group
	for len(live) > 0 {
		tx, err := c.db.Begin(true)
		if err != nil {
			failAll(live, fmt.Errorf("cannot begin transaction: %w", err))
			return
		}
		failed := -1
		var ferr error
		for i, r := range live {
			if ferr = r.fn(tx); ferr != nil {
				failed = i
				break
			}
		}
		if failed >= 0 {
			_ = tx.Rollback()
			live[failed].err <- ferr
			live = append(live[:failed:failed], live[failed+1:]...)
			continue
		}
		commit := func(tx *bolt.Tx, _ int) error { return tx.Commit() }
		if hook := c.commitHook.Load(); hook != nil {
			commit = *hook
		}
		began := time.Now()
		if err := commit(tx, len(live)); err != nil {
			_ = tx.Rollback() // bbolt has rolled back already; this is for a test's hook
			if IsDiskFull(err) {
				full := c.diskFull(err)
				c.disk.refusedWrites(full, len(live))
				err = full
			}
			failAll(live, fmt.Errorf("cannot commit: %w", err))
			return
		}
		c.disk.committed()
		c.commits.Add(1)
		c.writes.Add(uint64(len(live)))
		if o := c.observe.Load(); o != nil {
			(*o)(time.Since(began), len(live))
		}
		for _, r := range live {
			r.err <- nil
		}
		return
	}
}

// diskFull is err as a *DiskFullError naming the database's directory and
// its free space.
func (c *Committer) diskFull(err error) *DiskFullError {
	if e, ok := errors.AsType[*DiskFullError](err); ok {
		return e
	}
	dir := filepath.Dir(c.db.Path())
	free, _ := FreeBytes(dir)
	return &DiskFullError{Dir: dir, Free: free, Err: err}
}

func failAll(reqs []*writeReq, err error) {
	for _, r := range reqs {
		r.err <- err
	}
}
