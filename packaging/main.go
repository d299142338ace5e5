// Command packaging builds berth's .deb and .rpm with nfpm used as a library:
// it compiles the binaries (static, trimmed), lays them out with the units,
// D-Bus files, default config, sysusers/tmpfiles entries, man pages and
// completions listed in contents.go, and attaches the maintainer scripts in
// deb/ and rpm/.
//
//	cd packaging && go run . [--out DIR] [--version V] [--arch ARCH] [--formats deb,rpm]
//
// It lives in the main module (ADR 5): nfpm links into this program only,
// never into the daemons. Every binary is stamped with the package version
// (internal/version), which berth-imaged puts into isolation image tags.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
)

func main() {
	out := flag.String("out", "dist", "directory for the packages (relative to the repository root)")
	version := flag.String("version", "", "package version (default: from git describe, else 0.0.0+<commit>)")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH to build for")
	formats := flag.String("formats", "deb,rpm", "package formats")
	flag.Parse()

	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "packaging:", err)
		os.Exit(1)
	}
	paths, err := Build(Options{
		Root:    root,
		Out:     *out,
		Version: *version,
		Arch:    *arch,
		Formats: strings.Split(*formats, ","),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "packaging:", err)
		os.Exit(1)
	}
	for _, p := range paths {
		fmt.Println(p)
	}
}
