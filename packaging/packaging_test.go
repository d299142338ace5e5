package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

func TestPackages(t *testing.T) {
	t.Parallel()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Fatalf("dpkg-deb is needed to inspect the package (scripts/test.sh installs it): %v", err)
	}
	// Stand-in binaries: this test is about the layout, not the programs.
	bin := t.TempDir()
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(bin, b.name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	paths, err := Build(Options{Root: root, Out: out, Version: "1.2.3+4.gabc", Arch: "amd64", Formats: []string{"deb", "rpm"}, BinDir: bin})
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 4 {
		t.Fatalf("packages are %v, want berth and berth-cockpit as .deb and .rpm", paths)
	}
	deb, cockpitDeb, rpm, cockpitRPM := paths[0], paths[1], paths[2], paths[3]
	for p, want := range map[string]string{
		deb:        "berth_1.2.3+4.gabc-1_amd64.deb",
		cockpitDeb: "berth-cockpit_1.2.3+4.gabc-1_all.deb",
		rpm:        "berth-1.2.3+4.gabc-1.x86_64.rpm",
		cockpitRPM: "berth-cockpit-1.2.3+4.gabc-1.noarch.rpm",
	} {
		if filepath.Base(p) != want {
			t.Errorf("package %s, want %s", filepath.Base(p), want)
		}
	}

	t.Run("The_deb_installs_every_listed_path_with_its_mode", func(t *testing.T) {
		listing := run(t, "dpkg-deb", "-c", deb)
		for _, want := range []string{
			"-rwxr-xr-x root/root .* ./usr/bin/berthctl",
			"-rwxr-xr-x root/root .* ./usr/libexec/berth/berth-agent",
			"-rwxr-xr-x root/root .* ./usr/libexec/berth/berth-intake",
			"-rwxr-xr-x root/root .* ./usr/libexec/berth/berth-scheduler",
			"-rwxr-xr-x root/root .* ./usr/libexec/berth/berth-imaged",
			"-rwxr-xr-x root/root .* ./usr/libexec/berth/berth-egress",
			"-rw-r----- root/berth .* ./etc/berth/berth.toml",
			"./usr/lib/systemd/system/berth-intake.socket",
			"./usr/lib/systemd/system/berth-intake.service",
			"./usr/lib/systemd/system/berth-scheduler.service",
			"./usr/lib/systemd/system/berth-imaged.service",
			"./usr/share/dbus-1/system.d/dev.berth.Images1.conf",
			"./usr/share/dbus-1/system-services/dev.berth.Images1.service",
			"./usr/share/dbus-1/interfaces/dev.berth.Images1.xml",
			"./usr/share/dbus-1/system.d/dev.berth.Scheduler1.conf",
			"./usr/share/dbus-1/system-services/dev.berth.Intake1.service",
			"./usr/share/dbus-1/interfaces/dev.berth.Scheduler1.xml",
			"./usr/lib/sysusers.d/berth.conf",
			"./usr/lib/tmpfiles.d/berth.conf",
			"./usr/share/man/man1/berthctl.1",
			"./usr/share/man/man5/berth.toml.5",
			"./usr/share/bash-completion/completions/berthctl",
			"./usr/share/zsh/vendor-completions/_berthctl",
		} {
			if !matchesLine(listing, want) {
				t.Errorf("deb has no line matching %q:\n%s", want, listing)
			}
		}
	})

	t.Run("The_config_is_a_conffile_and_the_dependencies_are_declared", func(t *testing.T) {
		control := run(t, "dpkg-deb", "-I", deb)
		for _, want := range []string{"Version: 1.2.3+4.gabc-1", "Depends: dbus, systemd, e2fsprogs, util-linux", "Recommends: docker.io | docker-ce, busybox-static"} {
			if !strings.Contains(control, want) {
				t.Errorf("control has no %q:\n%s", want, control)
			}
		}
		dir := t.TempDir()
		run(t, "dpkg-deb", "-e", deb, dir)
		b, err := os.ReadFile(filepath.Join(dir, "conffiles"))
		if err != nil || strings.TrimSpace(string(b)) != "/etc/berth/berth.toml" {
			t.Errorf("conffiles = %q (%v), want /etc/berth/berth.toml", b, err)
		}
		pre, err := os.ReadFile(filepath.Join(dir, "preinst"))
		if err != nil || !strings.Contains(string(pre), "u berth-agent") || strings.Contains(string(pre), "#SYSUSERS#") {
			t.Errorf("preinst does not carry the sysusers entries:\n%s", pre)
		}
		for _, s := range []string{"postinst", "prerm", "postrm"} {
			if fi, err := os.Stat(filepath.Join(dir, s)); err != nil || fi.Mode().Perm()&0o111 == 0 {
				t.Errorf("%s missing or not executable: %v", s, err)
			}
		}
	})
}

func TestCockpitPackage(t *testing.T) {
	t.Parallel()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"dpkg-deb", "rpm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to inspect the packages (scripts/test.sh installs it): %v", tool, err)
		}
	}
	bin := t.TempDir()
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(bin, b.name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	paths, err := Build(Options{Root: root, Out: t.TempDir(), Version: "1.2.3", Arch: "amd64", Formats: []string{"deb", "rpm"}, BinDir: bin})
	if err != nil {
		t.Fatal(err)
	}
	deb, cockpitDeb, rpm, cockpitRPM := paths[0], paths[1], paths[2], paths[3]
	page := []string{"manifest.json", "index.html", "berth.js", "berth.css"}

	t.Run("The_deb_installs_the_page_as_it_is_in_the_repository", func(t *testing.T) {
		t.Parallel()
		listing := run(t, "dpkg-deb", "-c", cockpitDeb)
		dir := t.TempDir()
		run(t, "dpkg-deb", "-x", cockpitDeb, dir)
		for _, f := range page {
			if !matchesLine(listing, "-rw-r--r-- root/root .* ./usr/share/cockpit/berth/"+f) {
				t.Errorf("berth-cockpit has no %s readable by all:\n%s", f, listing)
			}
			got, err := os.ReadFile(filepath.Join(dir, "usr/share/cockpit/berth", f))
			want, _ := os.ReadFile(filepath.Join(root, "cockpit", f))
			if err != nil || string(got) != string(want) {
				t.Errorf("the packaged %s is not cockpit/%s (%v)", f, f, err)
			}
		}
		if n := strings.Count("\n"+listing, "\n-"); n != len(page) {
			t.Errorf("berth-cockpit installs %d files, want only the page's %d:\n%s", n, len(page), listing)
		}
	})

	t.Run("The_deb_depends_on_Cockpit_of_the_version_the_manifest_requires_and_berth_does_not", func(t *testing.T) {
		t.Parallel()
		control := run(t, "dpkg-deb", "-I", cockpitDeb)
		for _, want := range []string{
			"Package: berth-cockpit", "Version: 1.2.3-1", "Architecture: all",
			"Depends: cockpit-bridge (>= " + cockpitVersion + "), cockpit-system (>= " + cockpitVersion + ")",
		} {
			if !strings.Contains(control, want) {
				t.Errorf("berth-cockpit's control has no %q:\n%s", want, control)
			}
		}
		var manifest struct {
			Requires struct {
				Cockpit string `json:"cockpit"`
			} `json:"requires"`
		}
		b, err := os.ReadFile(filepath.Join(root, "cockpit/manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &manifest); err != nil {
			t.Fatalf("cockpit/manifest.json: %v", err)
		}
		if manifest.Requires.Cockpit != cockpitVersion {
			t.Errorf("the manifest requires Cockpit %q, the package depends on %s", manifest.Requires.Cockpit, cockpitVersion)
		}
		if main := run(t, "dpkg-deb", "-f", deb, "Depends", "Recommends", "Suggests"); strings.Contains(main, "cockpit") {
			t.Errorf("berth itself pulls in Cockpit:\n%s", main)
		}
	})

	t.Run("The_rpm_installs_the_page_and_requires_Cockpit_and_berth_does_not", func(t *testing.T) {
		t.Parallel()
		list := run(t, "rpm", "-qlp", cockpitRPM)
		for _, f := range page {
			if !strings.Contains(list, "/usr/share/cockpit/berth/"+f+"\n") {
				t.Errorf("berth-cockpit.rpm has no /usr/share/cockpit/berth/%s:\n%s", f, list)
			}
		}
		requires := run(t, "rpm", "-qpR", cockpitRPM)
		for _, want := range []string{"cockpit-bridge >= " + cockpitVersion, "cockpit-system >= " + cockpitVersion} {
			if !strings.Contains(requires, want+"\n") {
				t.Errorf("berth-cockpit.rpm does not require %q:\n%s", want, requires)
			}
		}
		if v := run(t, "rpm", "-qp", "--qf", "%{VERSION}-%{RELEASE} %{ARCH}", cockpitRPM); v != "1.2.3-1 noarch" {
			t.Errorf("berth-cockpit.rpm is %q, want 1.2.3-1 noarch", v)
		}
		if main := run(t, "rpm", "-qpR", "--recommends", rpm); strings.Contains(main, "cockpit") {
			t.Errorf("berth.rpm pulls in Cockpit:\n%s", main)
		}
	})
}

func TestThePackageVersionIsTheCheckoutsGitVersion(t *testing.T) {
	t.Parallel()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	v, err := Version(root)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := regexp.MatchString(`^(0\.0\.0\+[0-9a-f]{12}|\d+\.\d+\.\d+(\+\d+\.g[0-9a-f]+)?)$`, v); !ok {
		t.Errorf("Version = %q, want a tag's version or 0.0.0+<commit>", v)
	}
}

func TestThePackagedImageServiceTagsIsolationImagesWithThePackageVersion(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	_, err := os.Stat(imagectl.DefaultBusybox)
	testenv.Need(t, err == nil, "busybox-static is not installed (the default agent image needs it)")
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The package's binaries, built as Build builds them (the bus starts
	// berth-imaged from here); executable by the bus's activation.
	bin, err := testenv.OpenDir("berth-packaging-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	for _, name := range []string{"berth-imaged", "berth-agent"} {
		if err := buildBinary(root, bin, runtime.GOARCH, "1.2.3+4.gabc", name); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(t.TempDir(), "berth.toml")
	body := fmt.Sprintf("[scheduler]\nagent_binary = %q\n\n[[agents]]\nid = \"boxed\"\n[agents.container_mode]\nenabled = true\n", filepath.Join(bin, "berth-agent"))
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	b := testbus.Start(t, testbus.Options{BinDir: bin, Env: []string{"BERTH_CONFIG=" + cfg, "BERTH_STATE_DIR=" + t.TempDir()}})
	var tag string
	if err := b.Conn(t).Object(bus.ImagesName, bus.ImagesPath).Call(bus.ImagesInterface+".EnsureIsolationImage", 0, "boxed").Store(&tag); err != nil {
		t.Fatalf("EnsureIsolationImage: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{})
	})
	if want := imagectl.IsolatedRepository + ":1.2.3_4.gabc-"; !strings.HasPrefix(tag, want) {
		t.Errorf("the packaged berth-imaged tags isolation images %q, want %s<hash>", tag, want)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func matchesLine(listing, pattern string) bool {
	parts := strings.Split(pattern, " .* ")
	for _, line := range strings.Split(listing, "\n") {
		ok := true
		rest := line
		for _, p := range parts {
			i := strings.Index(rest, p)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(p):]
		}
		if ok {
			return true
		}
	}
	return false
}
