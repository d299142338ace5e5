// Command enforcer confines itself with confine.Enforce while several of
// its threads are busy elsewhere, then reports, for every thread, what the
// kernel says about it (/proc/self/task/*/status) and whether that thread
// can still open the file named by its first argument (outside the policy);
// on amd64 also what a 32-bit syscall (getpid through int 0x80) returns
// before and after.
// Used by agent/confine's tests: a test process cannot confine itself.
package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
)

const lockedThreads = 4

func main() {
	outside := os.Args[1]
	// Threads that exist before Enforce and sit in a blocking call while it
	// runs: each must end up confined all the same.
	start, results := make(chan struct{}), make(chan string, lockedThreads)
	var ready sync.WaitGroup
	for range lockedThreads {
		ready.Add(1)
		go func() {
			runtime.LockOSThread()
			ready.Done()
			<-start
			_, err := os.ReadFile(outside)
			results <- fmt.Sprintf("thread open: %v", err)
			// Kept locked until the process ends: a locked goroutine that
			// returns takes its thread with it.
			select {}
		}()
	}
	ready.Wait()
	if ret, ok := foreignGetpid(); ok {
		fmt.Printf("foreign getpid before: %d (pid %d)\n", ret, os.Getpid())
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	policy := agentproto.Policy{AllowRead: []string{"/proc/self"}}
	if _, err := confine.Enforce(policy, confine.KernelABI(), log); err != nil {
		fmt.Println("enforce:", err)
		os.Exit(1)
	}
	close(start)
	if ret, ok := foreignGetpid(); ok {
		fmt.Printf("foreign getpid after: %d\n", ret)
	}
	for range lockedThreads {
		fmt.Println(<-results)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		fmt.Println("tasks:", err)
		os.Exit(1)
	}
	for _, task := range tasks {
		status, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if errors.Is(err, fs.ErrNotExist) {
			continue // a thread the runtime ended since the listing
		}
		if err != nil {
			fmt.Println("status:", err)
			os.Exit(1)
		}
		var fields []string
		for _, line := range strings.Split(string(status), "\n") {
			for _, key := range []string{"NoNewPrivs:", "Seccomp:", "Seccomp_filters:"} {
				if strings.HasPrefix(line, key) {
					fields = append(fields, strings.Join(strings.Fields(line), " "))
				}
			}
		}
		fmt.Println("task", strings.Join(fields, " "))
	}
}
