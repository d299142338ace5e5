package boltstore

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/testkit/fulldisk"
)

var bucketData = []byte("data")

func openOnDisk(t *testing.T, dir string) (*bolt.DB, string) {
	t.Helper()
	path := filepath.Join(dir, "x.db")
	db, err := Open(path, "berth-test", []Migration{{Version: 1, Apply: func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketData)
		return err
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return db, path
}

// put is a write of one value large enough to need pages the file does not
// have yet.
func put(key string) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		return tx.Bucket(bucketData).Put([]byte(key), bytes.Repeat([]byte(key[:1]), 48<<10))
	}
}

// checkConsistent reopens path and runs bbolt's consistency check; it
// returns the keys stored.
func checkConsistent(t *testing.T, path string) []string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatalf("cannot reopen the database after the disk was full: %v", err)
	}
	defer db.Close()
	var keys []string
	err = db.View(func(tx *bolt.Tx) error {
		for cerr := range tx.Check() {
			t.Errorf("consistency check: %v", cerr)
		}
		return tx.Bucket(bucketData).ForEach(func(k, v []byte) error {
			if len(v) != 48<<10 || v[0] != k[0] || v[len(v)-1] != k[0] {
				t.Errorf("value of %s is damaged", k)
			}
			keys = append(keys, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

func TestAGroupRefusedByAFullDiskFailsEveryWaiterAndTheNextGroupSucceedsOnceThereIsRoom(t *testing.T) {
	t.Parallel()
	dir := fulldisk.Mount(t, 4<<20)
	db, path := openOnDisk(t, dir)
	c := NewCommitter(db)
	var log lines
	c.SetLogger(slog.New(slog.NewTextHandler(&log, nil)))
	t.Cleanup(func() { c.Close(); db.Close() })

	for _, k := range []string{"a1", "b1"} {
		if err := c.Write(put(k)); err != nil {
			t.Fatalf("write before the disk was full: %v", err)
		}
	}
	filler := fulldisk.Fill(t, dir)

	// Hold the first commit so that the next writes queue up behind it and
	// share one group.
	held, release := make(chan int, 1), make(chan struct{})
	var groups []int
	var gmu sync.Mutex
	c.SetCommitHook(func(tx *bolt.Tx, n int) error {
		gmu.Lock()
		groups = append(groups, n)
		first := len(groups) == 1
		gmu.Unlock()
		if first {
			held <- n
			<-release
		}
		return tx.Commit()
	})
	firstErr := make(chan error, 1)
	go func() { firstErr <- c.Write(put("c0")) }()
	<-held
	const waiters = 8
	errs := make(chan error, waiters)
	for i := range waiters {
		go func() { errs <- c.Write(put(fmt.Sprintf("d%d", i))) }()
	}
	for c.Waiting() < waiters {
		time.Sleep(time.Millisecond) // waiting for the writes to queue, not for something not to happen
	}
	close(release)
	if err := <-firstErr; !IsDiskFull(err) {
		t.Fatalf("first write on a full disk: %v, want a disk-full error", err)
	}
	for range waiters {
		err := <-errs
		if !IsDiskFull(err) {
			t.Fatalf("a waiter of the refused group got %v, want a disk-full error", err)
		}
		if !strings.Contains(err.Error(), dir) {
			t.Errorf("error %q does not name the state directory", err)
		}
	}
	gmu.Lock()
	if len(groups) != 2 || groups[1] != waiters {
		t.Errorf("commits held %v writes, want [1 %d]", groups, waiters)
	}
	gmu.Unlock()
	if c.DiskFull() == nil {
		t.Error("DiskFull is nil while the disk is full")
	}
	if n := log.count("state disk is full"); n != 1 {
		t.Errorf("the full disk was logged %d times for two refused groups, want once:\n%s", n, log.buf.String())
	}

	filler.Free(t)
	if err := c.Write(put("e1")); err != nil {
		t.Fatalf("write once there is room again: %v", err)
	}
	if c.DiskFull() != nil {
		t.Error("DiskFull still set after a commit succeeded")
	}
	if n := log.count("writes resumed"); n != 1 {
		t.Errorf("resumption logged %d times, want once:\n%s", n, log.buf.String())
	}
	c.Close()
	db.Close()

	got := strings.Join(checkConsistent(t, path), " ")
	if want := "a1 b1 e1"; got != want {
		t.Errorf("stored keys %q, want %q (the writes before the fill and after it, none of the refused)", got, want)
	}
}

func TestADatabaseStaysUsableThroughManyRefusedCommits(t *testing.T) {
	t.Parallel()
	dir := fulldisk.Mount(t, 4<<20)
	db, path := openOnDisk(t, dir)
	c := NewCommitter(db)
	t.Cleanup(func() { c.Close(); db.Close() })

	// Fill and free several times, with refused commits of several sizes in
	// between: each refused commit grows and rolls back in its own way.
	var want []string
	for round := range 4 {
		k := fmt.Sprintf("k%d", round)
		if err := c.Write(put(k)); err != nil {
			t.Fatalf("round %d: write with room: %v", round, err)
		}
		want = append(want, k)
		filler := fulldisk.Fill(t, dir)
		// bbolt reuses the blocks that earlier refused commits did get,
		// so a few writes may still fit; what fits is kept, the rest is
		// refused.
		refused := 0
		for i := 0; refused < round+2; i++ {
			if i == 50 {
				t.Fatalf("round %d: 50 writes on a full disk and only %d refused", round, refused)
			}
			k := fmt.Sprintf("x%d%02d", round, i)
			switch err := c.Write(put(k)); {
			case err == nil:
				want = append(want, k)
			case IsDiskFull(err):
				refused++
			default:
				t.Fatalf("round %d: write on a full disk: %v, want a disk-full error", round, err)
			}
		}
		// Reads go on while writes are refused.
		if err := db.View(func(tx *bolt.Tx) error {
			if tx.Bucket(bucketData).Get([]byte(k)) == nil {
				return fmt.Errorf("%s is gone", k)
			}
			return nil
		}); err != nil {
			t.Fatalf("round %d: read on a full disk: %v", round, err)
		}
		filler.Free(t)
	}
	c.Close()
	db.Close()
	slices.Sort(want)
	if got := strings.Join(checkConsistent(t, path), " "); got != strings.Join(want, " ") {
		t.Errorf("stored keys %q, want %q", got, strings.Join(want, " "))
	}
}

func TestIsDiskFullKnowsBboltsWaysOfSayingIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"A_wrapped_ENOSPC", fmt.Errorf("cannot commit: %w", &DiskFullError{Dir: "/x"}), true},
		{"Bbolts_resize_error_that_lost_its_errno", fmt.Errorf("file resize error: no space left on device"), true},
		{"A_quota_error", fmt.Errorf("write: %s", "disk quota exceeded"), true},
		{"An_io_error_is_not_a_full_disk", fmt.Errorf("write: input/output error"), false},
		{"Nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := IsDiskFull(tc.err); got != tc.want {
				t.Errorf("IsDiskFull(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
