// Command pause is the test cluster's pod sandbox image, like Kubernetes'
// own build/pause: it holds the pod's namespaces and does nothing until
// SIGTERM or SIGINT, when it exits 0. In a pod that shares its process
// namespace it is PID 1, so the processes a tool leaves behind become its
// children when their parents end: it reaps every one of them (wait4 on
// each SIGCHLD), or they would stay zombies for the pod's life.
//
// A module of its own, with no dependency: scripts/kube-cluster.sh builds it
// static (CGO_ENABLED=0) in a second, so the image is this one file and the
// cache is keyed by this source, not by the Kubernetes build.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	reap() // orphans that ended before Notify
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap waits for every child that has ended. SIGCHLDs coalesce (one for
// several children), so it loops until none is left to wait for.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil { // 0: children run; ECHILD: none
			return
		}
	}
}
