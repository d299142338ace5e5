package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager

	"github.com/berth-dev/berth/internal/version"
)

// Options says what Build makes.
type Options struct {
	Root    string   // repository root
	Out     string   // output directory; relative to Root unless absolute
	Version string   // "": Version(Root)
	Arch    string   // GOARCH
	Formats []string // "deb", "rpm"
	// BinDir holds prebuilt binaries; "" builds them into a temporary directory.
	BinDir string
}

// Build compiles the binaries and writes one package per format; it returns
// the package paths.
func Build(o Options) ([]string, error) {
	if o.Version == "" {
		v, err := Version(o.Root)
		if err != nil {
			return nil, err
		}
		o.Version = v
	}
	out := o.Out
	if !filepath.IsAbs(out) {
		out = filepath.Join(o.Root, out)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create output directory: %w", err)
	}
	binDir := o.BinDir
	if binDir == "" {
		tmp, err := os.MkdirTemp("", "berth-packaging-")
		if err != nil {
			return nil, fmt.Errorf("cannot create build directory: %w", err)
		}
		defer os.RemoveAll(tmp)
		if err := buildBinaries(o.Root, tmp, o.Arch, o.Version); err != nil {
			return nil, err
		}
		binDir = tmp
	}
	var paths []string
	for _, format := range o.Formats {
		for _, pkg := range packages {
			p, err := writePackage(o, pkg, format, binDir, out)
			if err != nil {
				return nil, err
			}
			paths = append(paths, p)
		}
	}
	return paths, nil
}

// buildBinaries builds every binary of the package.
func buildBinaries(root, binDir, arch, ver string) error {
	for _, b := range binaries {
		if err := buildBinary(root, binDir, arch, ver, b.name); err != nil {
			return err
		}
	}
	return nil
}

// buildBinary builds cmd/<name>: static, trimmed, stripped, stamped with the
// package version (berth-imaged tags isolation images with it).
func buildBinary(root, binDir, arch, ver, name string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w "+version.LDFlag(ver), "-o", filepath.Join(binDir, name), "./cmd/"+name)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cannot build %s: %w", name, err)
	}
	return nil
}

// info is the package metadata shared by all formats.
func info(o Options, format, binDir string) (*nfpm.Info, error) {
	scripts, err := maintainerScripts(o.Root, format)
	if err != nil {
		return nil, err
	}
	i := &nfpm.Info{
		Name:        "berth",
		Arch:        o.Arch,
		Platform:    "linux",
		Version:     o.Version,
		Release:     "1",
		Section:     "admin",
		Priority:    "optional",
		Maintainer:  "berth maintainers <berth@berth.dev>",
		Vendor:      "berth",
		Homepage:    "https://github.com/berth-dev/berth",
		License:     "Apache-2.0",
		Description: "systemd-native agent gateway\n" + description,
		Overridables: nfpm.Overridables{
			// e2fsprogs: workspace images (mkfs.ext4, resize2fs);
			// util-linux: setpriv, mount, losetup.
			Depends:  []string{"dbus", "systemd", "e2fsprogs", "util-linux"},
			Contents: nfpmContents(contents(), o.Root, binDir),
			Scripts:  scripts.common,
			RPM: nfpm.RPM{
				Summary: "systemd-native agent gateway",
				Group:   "System Environment/Daemons",
			},
		},
	}
	switch format {
	case "deb":
		// busybox-static: berth-imaged puts its /bin/busybox into the
		// default agent image (imagectl.DefaultBusybox).
		i.Recommends = []string{"docker.io | docker-ce", "busybox-static"}
	case "rpm":
		// Fedora ships moby-engine, Docker's repositories docker-ce.
		i.Recommends = []string{"(moby-engine or docker-ce)"}
		i.RPM.Scripts = scripts.rpm
	}
	return nfpm.WithDefaults(i), nil
}

const description = ` berth routes chat messages (signed webhooks, chat connectors) to AI agents,
 runs each agent's loop isolated from the host (Landlock-confined transient
 units, or containers) and sends the reply back. It runs as socket- and
 D-Bus-activated systemd services, is administered over D-Bus (busctl,
 berthctl) and keeps its state in BoltDB.`

// packages are what Build writes for each format, in this order.
var packages = []func(o Options, format, binDir string) (*nfpm.Info, error){info, cockpitInfo}

// cockpitInfo is berth-cockpit: berth's Cockpit page, a package of its own
// so that berth itself never pulls in Cockpit. The page links the shell's
// stylesheet (cockpit-system) and needs a bridge of the version its
// manifest requires.
func cockpitInfo(o Options, format, _ string) (*nfpm.Info, error) {
	i := &nfpm.Info{
		Name:        "berth-cockpit",
		Arch:        "all",
		Platform:    "linux",
		Version:     o.Version,
		Release:     "1",
		Section:     "admin",
		Priority:    "optional",
		Maintainer:  "berth maintainers <berth@berth.dev>",
		Vendor:      "berth",
		Homepage:    "https://github.com/berth-dev/berth",
		License:     "Apache-2.0",
		Description: "Cockpit page for berth\n" + cockpitDescription,
		Overridables: nfpm.Overridables{
			Depends:  []string{"cockpit-bridge (>= " + cockpitVersion + ")", "cockpit-system (>= " + cockpitVersion + ")"},
			Suggests: []string{"berth"},
			Contents: nfpmContents(cockpitContents(), o.Root, ""),
			RPM: nfpm.RPM{
				Summary: "Cockpit page for berth",
				Group:   "System Environment/Base",
			},
		},
	}
	if format == "rpm" {
		i.Arch = "noarch"
		i.Depends = []string{"cockpit-bridge >= " + cockpitVersion, "cockpit-system >= " + cockpitVersion}
	}
	return nfpm.WithDefaults(i), nil
}

const cockpitDescription = ` The "berth" page of Cockpit, the web console: the services' systemd states,
 queues and connectors, runs live with their details, each agent's sandbox
 and the isolation images, over berth's own D-Bus API. Who may change
 anything is decided by berth's D-Bus policy (root and group berth-admin).`

func writePackage(o Options, pkg func(Options, string, string) (*nfpm.Info, error), format, binDir, out string) (string, error) {
	packager, err := nfpm.Get(format)
	if err != nil {
		return "", fmt.Errorf("cannot package %s: %w", format, err)
	}
	i, err := pkg(o, format, binDir)
	if err != nil {
		return "", err
	}
	if err := nfpm.PrepareForPackager(i, format); err != nil {
		return "", fmt.Errorf("cannot prepare %s package: %w", format, err)
	}
	i.Target = filepath.Join(out, packager.ConventionalFileName(i))
	f, err := os.Create(i.Target)
	if err != nil {
		return "", fmt.Errorf("cannot create %s: %w", i.Target, err)
	}
	if err := packager.Package(i, f); err != nil {
		f.Close()
		return "", fmt.Errorf("cannot write %s package: %w", format, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("cannot write %s: %w", i.Target, err)
	}
	return i.Target, nil
}

type scriptSet struct {
	common nfpm.Scripts
	rpm    nfpm.RPMScripts
}

// maintainerScripts writes the format's scripts, with the sysusers entries
// spliced in where they say #SYSUSERS#, to a temporary directory that lives
// as long as the process (nfpm reads scripts by path).
func maintainerScripts(root, format string) (scriptSet, error) {
	sysusers, err := os.ReadFile(filepath.Join(root, "packaging/systemd/berth.sysusers"))
	if err != nil {
		return scriptSet{}, fmt.Errorf("cannot read sysusers entries: %w", err)
	}
	dir, err := os.MkdirTemp("", "berth-scripts-")
	if err != nil {
		return scriptSet{}, fmt.Errorf("cannot create script directory: %w", err)
	}
	prepare := func(name string) (string, error) {
		src := filepath.Join(root, "packaging", format, name)
		body, err := os.ReadFile(src)
		if err != nil {
			return "", fmt.Errorf("cannot read maintainer script: %w", err)
		}
		body = []byte(strings.ReplaceAll(string(body), "#SYSUSERS#", strings.TrimRight(string(sysusers), "\n")))
		dst := filepath.Join(dir, format+"-"+name)
		if err := os.WriteFile(dst, body, 0o755); err != nil {
			return "", fmt.Errorf("cannot write maintainer script: %w", err)
		}
		return dst, nil
	}
	names := map[string][4]string{
		"deb": {"preinst", "postinst", "prerm", "postrm"},
		"rpm": {"pre", "post", "preun", "postun"},
	}[format]
	if names[0] == "" {
		return scriptSet{}, fmt.Errorf("no maintainer scripts for format %q", format)
	}
	var paths [4]string
	for i, n := range names {
		if paths[i], err = prepare(n); err != nil {
			return scriptSet{}, err
		}
	}
	return scriptSet{common: nfpm.Scripts{
		PreInstall:  paths[0],
		PostInstall: paths[1],
		PreRemove:   paths[2],
		PostRemove:  paths[3],
	}}, nil
}

// Version is the package version of the checkout at root, from `git
// describe` (internal/version.FromGit): v1.2.3 → 1.2.3, three commits after
// it → 1.2.3+3.gabcdef0 (sorts after 1.2.3); without a tag 0.0.0+<commit>.
func Version(root string) (string, error) { return version.FromGit(root) }

// repoRoot is the directory above the working directory that holds the
// berth module's go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/berth-dev/berth\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the berth repository (go.mod of github.com/berth-dev/berth) above the working directory")
		}
		dir = parent
	}
}
