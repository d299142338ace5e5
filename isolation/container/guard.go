package container

import (
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/isolation"
)

// The config refuses settings that would hand a container the host (its
// network, its engine socket, its system directories) or switch off the
// kernel's filters. checkPlan applies the same rules again to the plan, so
// a plan that bypassed the config's checks still never reaches the engine.

// forbiddenSources are host trees no container may see: the host's
// configuration and secrets, kernel interfaces, devices and runtime state
// (which holds the engine's socket).
var forbiddenSources = []string{"/etc", "/proc", "/sys", "/dev", "/run", "/var/run", "/var/lib/docker", "/boot"}

func checkPlan(p isolation.Plan) error {
	if err := p.RequireLimits(); err != nil {
		return err
	}
	// The kernel reads tmpfs size=0 as no size limit at all.
	if p.Limits.TmpfsBytes <= 0 {
		return isolation.Errorf(isolation.ReasonStart, "cannot run the plan of run %s (agent %s): it has no size for the container's %s tmpfs", p.RunID, p.AgentID, isolation.ContainerTmp)
	}
	switch mode := p.Network.Mode; {
	case mode == "bridge" || mode == "none":
	case mode == "host":
		return isolation.Errorf(isolation.ReasonStart, `container network "host" would share the host's network stack (and its local services) with the agent; use "bridge" or "none"`)
	default:
		return isolation.Errorf(isolation.ReasonStart, "container network %q is not one of bridge, none", mode)
	}
	for _, m := range p.Mounts {
		if err := checkMount(p, m); err != nil {
			return err
		}
	}
	for _, opt := range p.Container.SecurityOpt {
		key, value, ok := strings.Cut(opt, "=")
		if !ok {
			key, value, _ = strings.Cut(opt, ":")
		}
		switch {
		case (key == "seccomp" || key == "apparmor") && value == "unconfined":
			return isolation.Errorf(isolation.ReasonStart, "security option %q switches off the kernel's %s filter; refused", opt, key)
		case key == "label" && value == "disable":
			return isolation.Errorf(isolation.ReasonStart, "security option %q switches off SELinux labelling; refused", opt)
		case key != "seccomp" && key != "apparmor" && key != "label":
			return isolation.Errorf(isolation.ReasonStart, "security option %q is not allowed (allowed: apparmor, label, seccomp)", opt)
		}
	}
	return nil
}

func checkMount(p isolation.Plan, m isolation.Mount) error {
	if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
		return isolation.Errorf(isolation.ReasonStart, "mount %s:%s: source and destination must be absolute paths", m.Source, m.Target)
	}
	for _, src := range []string{m.Source, resolved(m.Source)} {
		src = filepath.Clean(src)
		if src == "/" {
			return isolation.Errorf(isolation.ReasonStart, "mount %s: binding the host's root directory is refused", m.Source)
		}
		if strings.Contains(src, "docker.sock") {
			return isolation.Errorf(isolation.ReasonStart, "mount %s: the Docker socket gives root on the host; it is never mounted", m.Source)
		}
		for _, f := range forbiddenSources {
			if src == f || strings.HasPrefix(src, f+"/") {
				return isolation.Errorf(isolation.ReasonStart, "mount %s: sources under %s are refused (host configuration, kernel or runtime state)", m.Source, f)
			}
		}
	}
	switch target := filepath.Clean(m.Target); target {
	case "/", isolation.ContainerTmp:
		return isolation.Errorf(isolation.ReasonStart, "mount %s:%s: destination %s is managed by berth", m.Source, m.Target, target)
	case isolation.ContainerWorkspace:
		if filepath.Clean(m.Source) != filepath.Clean(p.Workspace) {
			return isolation.Errorf(isolation.ReasonStart, "mount %s:%s: destination %s is managed by berth", m.Source, m.Target, target)
		}
	}
	return nil
}

// resolved follows symlinks when the path exists, so a link into /etc is
// judged by its target.
func resolved(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}
