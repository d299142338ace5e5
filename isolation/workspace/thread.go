package workspace

import (
	"errors"
	"runtime"

	"golang.org/x/sys/unix"
)

// Other parts of the scheduler move locked threads into a run's own mount
// namespace; a mount(8) started from such a thread would mount where
// neither dockerd nor the host run can see it. So the work that reads or
// changes mounts runs on a thread checked to be in the mount namespace the
// process started in (init runs on the main thread before any of that).
var startMountNS = mountNS()

func mountNS() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/mnt", &st); err != nil {
		return 0
	}
	return st.Ino
}

// inStartNamespace runs f on a thread of the process's own mount
// namespace. A thread found elsewhere is not handed back: its goroutine
// exits locked and the runtime ends the thread.
func inStartNamespace(f func() error) error {
	for range 16 {
		type result struct {
			ok  bool
			err error
		}
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			if startMountNS != 0 && mountNS() != startMountNS {
				done <- result{}
				return
			}
			err := f()
			runtime.UnlockOSThread()
			done <- result{ok: true, err: err}
		}()
		if r := <-done; r.ok {
			return r.err
		}
	}
	return errors.New("no thread of this process is in its own mount namespace")
}
