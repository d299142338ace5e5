// Command genfilter writes agent/confine/zfilter_<goarch>.go, berth-agent's
// syscall filter assembled for each architecture (see package
// syscallfilter). Run it through go generate in agent/confine.
package main

import (
	"fmt"
	"os"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/agent/confine/syscallfilter"
)

func main() {
	for _, goarch := range syscallfilter.GOARCHes {
		src, err := syscallfilter.GoFile("confine", confine.Refused, goarch)
		if err == nil {
			err = os.WriteFile("zfilter_"+goarch+".go", src, 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "genfilter: cannot generate the filter of %s: %v\n", goarch, err)
			os.Exit(1)
		}
	}
}
