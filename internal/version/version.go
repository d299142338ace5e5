// Package version is berth's version as the binaries know it. The build
// stamps it with the linker (-X, see LDFlag): packaging with the package
// version, internal/testkit/devstack with the working tree's version marked
// as a dev build. The image service puts it into isolation image tags
// (berth-isolated:<version>-<hash>).
package version

import (
	"fmt"
	"os/exec"
	"regexp"
	"runtime/debug"
	"strings"
)

// stamped is set by the linker: -X github.com/berth-dev/berth/internal/version.stamped=V.
var stamped string

// Unknown is the version of a binary built without a stamp or module version.
const Unknown = "0.0.0-dev"

// String is the stamped version, else the module version Go recorded (a
// binary installed with go install), else Unknown.
func String() string {
	if stamped != "" {
		return stamped
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return Unknown
}

// LDFlag is the linker flag that stamps v into a binary.
func LDFlag(v string) string {
	return "-X github.com/berth-dev/berth/internal/version.stamped=" + v
}

var describeRe = regexp.MustCompile(`^v?(\d+\.\d+\.\d+)(?:-(\d+)-g([0-9a-f]+))?$`)

// FromGit is the version of the checkout at root from `git describe`:
// v1.2.3 → 1.2.3, three commits after it → 1.2.3+3.gabcdef0 (sorts after
// 1.2.3); without a tag 0.0.0+<commit>.
func FromGit(root string) (string, error) {
	if out, err := gitOutput(root, "describe", "--tags", "--match", "v[0-9]*"); err == nil {
		if v, ok := FromDescribe(out); ok {
			return v, nil
		}
	}
	sha, err := gitOutput(root, "rev-parse", "--short=12", "HEAD")
	if err != nil {
		return "", fmt.Errorf("cannot find a version: no git tag and no commit: %w", err)
	}
	return "0.0.0+" + sha, nil
}

// FromDescribe turns `git describe` output into a version.
func FromDescribe(describe string) (string, bool) {
	m := describeRe.FindStringSubmatch(describe)
	if m == nil {
		return "", false
	}
	if m[2] == "" {
		return m[1], true
	}
	return m[1] + "+" + m[2] + ".g" + m[3], true
}

// Dev is the version of a dev build of the checkout at root (the working
// tree, perhaps with changes of its own): FromGit's with a "dev" build
// mark, 1.2.3+dev or 1.2.3+3.gabcdef0.dev; 0.0.0+dev outside git.
func Dev(root string) string {
	v, err := FromGit(root)
	switch {
	case err != nil:
		return "0.0.0+dev"
	case strings.Contains(v, "+"):
		return v + ".dev"
	default:
		return v + "+dev"
	}
}

func gitOutput(root string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}
