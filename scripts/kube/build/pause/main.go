// Command pause is the cluster's pod sandbox image: it holds the pod's
// namespaces and does nothing until it is told to stop, like Kubernetes'
// own build/pause. Built static (CGO_ENABLED=0) so the image is this one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	// Reap children: as a pod's PID 1 (shared process namespace) it inherits orphans.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGCHLD)
	<-sig
}
