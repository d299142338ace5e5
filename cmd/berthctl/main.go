// Command berthctl administers berth over D-Bus. See `berthctl --help`.
package main

import (
	"os"

	"github.com/berth-dev/berth/internal/ctl"
)

func main() {
	os.Exit(ctl.Main(os.Args[1:], os.Stdout, os.Stderr))
}
