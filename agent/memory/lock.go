package memory

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// LockName is the file in the workspace whose lock serializes writes to
// the agent's shared files (memory.db, MEMORY.md, USER.md, SOUL.md): an
// agent with conversation sandboxes runs several conversations at once,
// each in a process of its own, over one workspace (issue 22).
const LockName = ".berth-shared.lock"

// SharedLockWait bounds the wait for the lock: a tool of any conversation
// can open the file and hold the lock forever, and a write under it takes
// milliseconds.
const SharedLockWait = 10 * time.Second

// LockShared takes the workspace's shared-files lock, waiting for another
// conversation's write to end, at most SharedLockWait; call the returned
// function to release it.
// The lock dies with the process that holds it, so a killed sandbox never
// leaves it taken.
func LockShared(workspace string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(workspace, LockName), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cannot open the shared files' lock: %w", err)
	}
	// flock has no timeout: poll, backing off to a tenth of a second.
	deadline := time.Now().Add(SharedLockWait)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			f.Close()
			return nil, fmt.Errorf("cannot take the shared files' lock: %w", err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("cannot take the shared files' lock: another process has held %s for over %s (a tool that keeps it?)", LockName, SharedLockWait)
		}
		time.Sleep(pause)
	}
}
