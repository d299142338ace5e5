package version_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/version"
)

func TestABinaryReportsTheVersionItWasStampedWith(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		ldflags []string
		want    string
	}{
		{"Stamped_with_a_package_version", []string{"-ldflags=" + version.LDFlag("1.2.3+4.gabcdef0")}, "1.2.3+4.gabcdef0"},
		{"Stamped_among_other_linker_flags", []string{"-ldflags=-s -w " + version.LDFlag("0.0.0~installtest")}, "0.0.0~installtest"},
		// In a git checkout Go records a pseudo-version (a module version)
		// unless told not to; a machine's GOFLAGS must not decide this case.
		{"Not_stamped", []string{"-buildvcs=false"}, version.Unknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bin := filepath.Join(t.TempDir(), "printversion")
			args := append(append([]string{"build", "-o", bin}, tt.ldflags...), "./testdata/printversion")
			if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			out, err := exec.Command(bin).Output()
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(out)); got != tt.want {
				t.Errorf("the binary reports %q, want %q", got, tt.want)
			}
		})
	}
}

func TestGitDescribeBecomesAVersion(t *testing.T) {
	t.Parallel()
	tests := []struct{ describe, want string }{
		{"v1.2.3", "1.2.3"},
		{"1.2.3", "1.2.3"},
		{"v1.2.3-4-gabcdef01", "1.2.3+4.gabcdef01"},
	}
	for _, tt := range tests {
		if got, ok := version.FromDescribe(tt.describe); !ok || got != tt.want {
			t.Errorf("%q → %q (%v), want %q", tt.describe, got, ok, tt.want)
		}
	}
	if v, ok := version.FromDescribe("nightly"); ok {
		t.Errorf("a tag that is no version was taken as %q", v)
	}
}

func TestADevBuildIsMarkedAsOne(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	release, err := version.FromGit(root)
	if err != nil {
		t.Fatal(err)
	}
	dev := version.Dev(root)
	if !strings.HasPrefix(dev, release+"+") && !strings.HasPrefix(dev, release+".") || !strings.HasSuffix(dev, "dev") {
		t.Errorf("Dev = %q, want %q with a dev build mark", dev, release)
	}
	if got := version.Dev(t.TempDir()); got != "0.0.0+dev" {
		t.Errorf("Dev outside a git checkout = %q, want 0.0.0+dev", got)
	}
}
