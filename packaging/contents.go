package main

import (
	"os"
	"path"

	"github.com/goreleaser/nfpm/v2/files"
)

// kind is what a packaged path is, which decides its mode and how the
// package manager treats it.
type kind int

const (
	binary kind = iota // 0755, replaced on upgrade
	data               // 0644, replaced on upgrade
	config             // kept on upgrade when the admin changed it
	dir                // an empty directory the package owns
)

// entry is one path in the package. src is relative to the repository root
// (binaries: to the build directory).
type entry struct {
	src   string
	dst   string
	kind  kind
	mode  os.FileMode // 0: the kind's default
	group string      // "": root
}

const (
	libexec      = "/usr/libexec/berth"
	systemdUnits = "/usr/lib/systemd/system"
)

// binaries are built by build.go into the build directory, one per cmd/.
var binaries = []struct{ name, dst string }{
	{"berthctl", "/usr/bin"},
	{"berth-intake", libexec},
	{"berth-scheduler", libexec},
	{"berth-imaged", libexec},
	{"berth-metrics", libexec},
	{"berth-egress", libexec},
	{"berth-agent", libexec},
}

// contents is everything the package installs. The units and D-Bus files
// come from units/ unchanged: what the tests run is what gets installed.
func contents() []entry {
	var es []entry
	for _, b := range binaries {
		es = append(es, entry{src: b.name, dst: path.Join(b.dst, b.name), kind: binary})
	}
	for _, u := range []string{"berth-intake.socket", "berth-intake.service", "berth-scheduler.service", "berth-imaged.service", "berth-metrics.socket", "berth-metrics.service", "berth-runs.slice"} {
		es = append(es, entry{src: "units/systemd/" + u, dst: path.Join(systemdUnits, u), kind: data})
	}
	for _, name := range []string{"dev.berth.Intake1", "dev.berth.Scheduler1", "dev.berth.Images1"} {
		es = append(es,
			entry{src: "units/dbus/" + name + ".conf", dst: "/usr/share/dbus-1/system.d/" + name + ".conf", kind: data},
			entry{src: "units/dbus/" + name + ".service", dst: "/usr/share/dbus-1/system-services/" + name + ".service", kind: data},
			entry{src: "units/dbus/" + name + ".xml", dst: "/usr/share/dbus-1/interfaces/" + name + ".xml", kind: data},
		)
	}
	// Every daemon serves dev.berth.Metrics1 beside its own interface.
	es = append(es, entry{src: "units/dbus/dev.berth.Metrics1.xml", dst: "/usr/share/dbus-1/interfaces/dev.berth.Metrics1.xml", kind: data})
	es = append(es,
		// Readable by group berth: berth-intake runs as user berth.
		entry{src: "packaging/etc/berth.toml", dst: "/etc/berth/berth.toml", kind: config, mode: 0o640, group: "berth"},
		entry{dst: "/etc/berth/berth.d", kind: dir},
		entry{src: "packaging/systemd/berth.sysusers", dst: "/usr/lib/sysusers.d/berth.conf", kind: data},
		entry{src: "packaging/systemd/berth.tmpfiles", dst: "/usr/lib/tmpfiles.d/berth.conf", kind: data},
		entry{src: "packaging/systemd/berth.preset", dst: "/usr/lib/systemd/system-preset/80-berth.preset", kind: data},
		entry{src: "packaging/man/berthctl.1", dst: "/usr/share/man/man1/berthctl.1", kind: data},
		entry{src: "packaging/man/berth.toml.5", dst: "/usr/share/man/man5/berth.toml.5", kind: data},
		entry{src: "packaging/completion/berthctl.bash", dst: "/usr/share/bash-completion/completions/berthctl", kind: data},
		entry{src: "packaging/completion/_berthctl", dst: "/usr/share/zsh/vendor-completions/_berthctl", kind: data},
	)
	return es
}

// cockpitVersion is the oldest Cockpit the page works with: the version its
// manifest requires (Debian 12's).
const cockpitVersion = "287"

// cockpitContents is the berth-cockpit package: the page as it is in
// cockpit/, no build step.
func cockpitContents() []entry {
	var es []entry
	for _, f := range []string{"manifest.json", "index.html", "berth.js", "berth.css"} {
		es = append(es, entry{src: "cockpit/" + f, dst: "/usr/share/cockpit/berth/" + f, kind: data})
	}
	return es
}

// nfpmContents turns entries into nfpm's list; srcDir is the repository root
// and binDir holds the built binaries.
func nfpmContents(es []entry, srcDir, binDir string) files.Contents {
	var out files.Contents
	for _, e := range es {
		c := &files.Content{Destination: e.dst, FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root"}}
		if e.group != "" {
			c.FileInfo.Group = e.group
		}
		switch e.kind {
		case binary:
			c.Source = path.Join(binDir, e.src)
			c.FileInfo.Mode = 0o755
		case data:
			c.Source = path.Join(srcDir, e.src)
			c.FileInfo.Mode = 0o644
		case config:
			c.Source = path.Join(srcDir, e.src)
			c.Type = files.TypeConfigNoReplace
			c.FileInfo.Mode = 0o644
		case dir:
			c.Type = files.TypeDir
			c.FileInfo.Mode = 0o755
		}
		if e.mode != 0 {
			c.FileInfo.Mode = e.mode
		}
		out = append(out, c)
	}
	return out
}
