package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// Guards for container_mode: settings that would hand a container the host
// (its network, its engine socket, its system directories) or switch off the
// kernel's filters are configuration errors, not warnings. The container
// backend applies the same checks again before it creates anything.

// MaxWarm caps container_mode.warm.
const MaxWarm = 16

// ContainerWorkspace and ContainerTmp are where a container agent finds its
// workspace and scratch space.
const (
	ContainerWorkspace = "/workspace"
	ContainerTmp       = "/tmp"
)

// forbiddenBindSources are host trees no container may see: the host's
// configuration and secrets, kernel interfaces, devices and runtime state
// (which holds the engine's socket).
var forbiddenBindSources = []string{"/etc", "/proc", "/sys", "/dev", "/run", "/var/run", "/var/lib/docker", "/boot"}

var runtimePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$`)

// NetworkMode is container_mode.network, read once: "bridge" or "none";
// anything else is refused with checkNetwork's reason.
type NetworkMode string

// UnmarshalText accepts only the modes checkNetwork allows.
func (m *NetworkMode) UnmarshalText(text []byte) error {
	if msg := checkNetwork(string(text)); msg != "" {
		return errors.New(msg)
	}
	*m = NetworkMode(text)
	return nil
}

// checkNetwork explains why a container_mode.network value is refused, or
// returns "".
func checkNetwork(s string) string {
	switch {
	case s == "bridge" || s == "none":
		return ""
	case s == "host":
		return `"host" would share the host's network stack (and its local services) with the agent; use "bridge" or "none"`
	case strings.HasPrefix(s, "container:"):
		return fmt.Sprintf(`%q would join another container's network namespace; use "bridge" or "none"`, s)
	}
	return fmt.Sprintf(`%q is not one of bridge, none`, s)
}

// checkBind explains why a container_mode.binds entry is refused, or
// returns "". An entry is SRC:DST or SRC:DST:MODE with absolute paths and
// MODE ro or rw.
func checkBind(s string) string {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return fmt.Sprintf("%q is not SRC:DST or SRC:DST:ro|rw", s)
	}
	src, dst := parts[0], parts[1]
	if len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw" {
		return fmt.Sprintf("%q: mode %q is not ro or rw", s, parts[2])
	}
	if !filepath.IsAbs(src) || !filepath.IsAbs(dst) {
		return fmt.Sprintf("%q: source and destination must be absolute paths", s)
	}
	for _, p := range []string{src, resolvedPath(src)} {
		if msg := forbiddenSource(p); msg != "" {
			return fmt.Sprintf("%q: %s", s, msg)
		}
	}
	switch filepath.Clean(dst) {
	case "/", ContainerWorkspace, ContainerTmp:
		return fmt.Sprintf("%q: destination %s is managed by berth", s, filepath.Clean(dst))
	}
	return ""
}

func forbiddenSource(p string) string {
	p = filepath.Clean(p)
	if p == "/" {
		return "binding the host's root directory is refused"
	}
	if strings.Contains(filepath.Base(p), "docker.sock") || strings.Contains(p, "docker.sock") {
		return "the Docker socket gives root on the host; it is never mounted"
	}
	for _, f := range forbiddenBindSources {
		if p == f || strings.HasPrefix(p, f+"/") {
			return fmt.Sprintf("sources under %s are refused (host configuration, kernel or runtime state)", f)
		}
	}
	return ""
}

// resolvedPath follows symlinks when the path exists, so a link into /etc is
// judged by its target.
func resolvedPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// checkSecurityOpt explains why a container_mode.security_opt entry is
// refused, or returns "". Allowed: apparmor=PROFILE, label=... (SELinux) and
// seccomp=/absolute/profile.json; never "unconfined", label=disable or
// no-new-privileges=false.
func checkSecurityOpt(s string) string {
	key, value, ok := strings.Cut(s, "=")
	if !ok {
		key, value, ok = strings.Cut(s, ":")
	}
	if !ok || value == "" {
		return fmt.Sprintf("%q is not KEY=VALUE (apparmor=PROFILE, label=..., seccomp=/path/profile.json)", s)
	}
	switch key {
	case "seccomp", "apparmor":
		if value == "unconfined" {
			return fmt.Sprintf("%q switches off the kernel's %s filter; refused", s, key)
		}
		if key == "seccomp" && !filepath.IsAbs(value) {
			return fmt.Sprintf("%q: a seccomp profile is the absolute path of a JSON file", s)
		}
	case "label":
		if value == "disable" {
			return fmt.Sprintf("%q switches off SELinux labelling; refused", s)
		}
	case "no-new-privileges":
		return fmt.Sprintf("%q: no-new-privileges is always on for berth containers", s)
	default:
		return fmt.Sprintf("%q: unknown security option %q (allowed: apparmor, label, seccomp)", s, key)
	}
	return ""
}

// CheckRuntime explains why a container_mode.runtime name is malformed, or
// returns "". Whether the engine knows it is checked by the backend.
func CheckRuntime(s string) string {
	if !runtimePattern.MatchString(s) {
		return fmt.Sprintf("%q is not a runtime name (runc, runsc, kata-runtime, sysbox-runc, ...)", s)
	}
	return ""
}
