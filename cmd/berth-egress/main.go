// Command berth-egress is one run's egress proxy, started by berth-scheduler
// as an unprivileged user with the run's socket on fd 3 and its policy on
// stdin (services/egress).
package main

import (
	"log/slog"
	"os"

	"github.com/berth-dev/berth/services/egress"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := egress.RunChild(os.Stdin, os.Stdout, log); err != nil {
		log.Error("berth-egress", "err", err)
		os.Exit(1)
	}
}
