package memory

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// LockName is the file in the workspace whose lock serializes writes to
// the agent's shared files (memory.db, MEMORY.md, USER.md, SOUL.md): an
// agent with conversation sandboxes runs several conversations at once,
// each in a process of its own, over one workspace (issue 22).
const LockName = ".berth-shared.lock"

// LockShared takes the workspace's shared-files lock, waiting for another
// conversation's write to end; call the returned function to release it.
// The lock dies with the process that holds it, so a killed sandbox never
// leaves it taken.
func LockShared(workspace string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(workspace, LockName), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cannot open the shared files' lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot take the shared files' lock: %w", err)
	}
	return func() { f.Close() }, nil
}
