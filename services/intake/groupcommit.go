package intake

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// maxGroup is the most writes one commit holds, so that a burst never
// builds one huge transaction.
const maxGroup = 1024

var errStoreClosed = errors.New("intake database is closed")

// groupCommit is intake.db's only writer: concurrent writes (accepted
// messages, submitted marks, replies) wait in a queue while the previous
// commit is on its way to disk, and then share the next transaction and its
// fsync. A write returns only after the commit that holds it: nothing is
// acknowledged that is not on disk. There is no timer: a lone write is
// committed at once, and under load each commit takes everything that
// arrived during the one before.
type groupCommit struct {
	db   *bolt.DB
	reqs chan *writeReq // buffered: its length is the writes waiting
	quit chan struct{}
	done chan struct{}
	once sync.Once

	// commitHook, when set (tests), commits in place of tx.Commit, to hold
	// or fail a commit.
	commitHook atomic.Pointer[func(*bolt.Tx) error]
	// commits and writes count successful commits and the writes they held.
	commits, writes atomic.Uint64
}

type writeReq struct {
	fn  func(*bolt.Tx) error
	err chan error
}

func newGroupCommit(db *bolt.DB) *groupCommit {
	g := &groupCommit{
		db:   db,
		reqs: make(chan *writeReq, maxGroup),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	go g.run()
	return g
}

// write runs fn in a read-write transaction shared with other writers and
// returns once that transaction is committed (nil) or has failed. fn may be
// called more than once (in a fresh transaction each time: a batch is
// retried without a write whose fn failed), so it must set its results
// afresh on every call and have no other side effects.
func (g *groupCommit) write(fn func(*bolt.Tx) error) error {
	r := &writeReq{fn: fn, err: make(chan error, 1)}
	select {
	case g.reqs <- r:
	case <-g.quit:
		return errStoreClosed
	}
	select {
	case err := <-r.err:
		return err
	case <-g.done:
		select {
		case err := <-r.err: // committed just before the writer stopped
			return err
		default:
			return errStoreClosed
		}
	}
}

// close commits what is queued, stops the writer and returns once it has.
func (g *groupCommit) close() {
	g.once.Do(func() { close(g.quit) })
	<-g.done
}

func (g *groupCommit) run() {
	defer close(g.done)
	batch := make([]*writeReq, 0, maxGroup)
	for {
		var first *writeReq
		select {
		case first = <-g.reqs:
		case <-g.quit:
			// Finish what was queued before the stop.
			for {
				select {
				case r := <-g.reqs:
					g.commitGroup(append(batch[:0], r))
				default:
					return
				}
			}
		}
		batch = append(batch[:0], first)
	fill:
		for len(batch) < maxGroup {
			select {
			case r := <-g.reqs:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		g.commitGroup(batch)
	}
}

// commitGroup applies every write of batch in one transaction and commits
// it. A write whose fn fails gets its error and the rest are applied again
// in a fresh transaction without it; a failed commit fails every write it
// held.
func (g *groupCommit) commitGroup(batch []*writeReq) {
	live := batch
	for len(live) > 0 {
		tx, err := g.db.Begin(true)
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
		commit := (*bolt.Tx).Commit
		if hook := g.commitHook.Load(); hook != nil {
			commit = *hook
		}
		if err := commit(tx); err != nil {
			_ = tx.Rollback() // bbolt has rolled back already; this is for a test's commit
			failAll(live, fmt.Errorf("cannot commit: %w", err))
			return
		}
		g.commits.Add(1)
		g.writes.Add(uint64(len(live)))
		for _, r := range live {
			r.err <- nil
		}
		return
	}
}

func failAll(reqs []*writeReq, err error) {
	for _, r := range reqs {
		r.err <- err
	}
}
