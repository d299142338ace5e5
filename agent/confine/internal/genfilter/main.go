// Command genfilter writes agent/confine/zfilter_<goarch>.go, berth-agent's
// syscall filter assembled for each architecture (see package
// syscallfilter), and internal/hostsandbox/zrefused_<goarch>.go, the names
// it refuses, which the host summarises. Run it through go generate in
// agent/confine.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/berth-dev/berth/agent/confine/syscallfilter"
	"github.com/berth-dev/berth/internal/hostsandbox"
)

// leafDir is internal/hostsandbox as seen from agent/confine, where go
// generate runs this.
var leafDir = filepath.Join("..", "..", "internal", "hostsandbox")

func main() {
	for _, goarch := range syscallfilter.GOARCHes {
		src, err := syscallfilter.GoFile("confine", hostsandbox.Refused, goarch)
		if err == nil {
			err = os.WriteFile("zfilter_"+goarch+".go", src, 0o644)
		}
		if err == nil {
			src, err = syscallfilter.RefusedGoFile("hostsandbox", hostsandbox.Refused, goarch)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(leafDir, "zrefused_"+goarch+".go"), src, 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "genfilter: cannot generate the filter of %s: %v\n", goarch, err)
			os.Exit(1)
		}
	}
}
