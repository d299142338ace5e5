package imagectl

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// dpkgStatusPath is dpkg's database of installed packages.
const dpkgStatusPath = "/var/lib/dpkg/status"

// BaseDpkgStatus reads a base image's dpkg status file through the engine
// (a container is created, never started, and removed). A base without one
// is not Debian-family and is refused by name.
func BaseDpkgStatus(ctx context.Context, cli *client.Client, baseRef, imageID string) ([]byte, error) {
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: imageID, Cmd: []string{"/nonexistent"}, Labels: map[string]string{LabelKind: "probe"}},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read the packages of %s: %w", baseRef, err)
	}
	defer func() {
		rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), EngineTimeout)
		defer cancel()
		_, _ = cli.ContainerRemove(rmCtx, created.ID, client.ContainerRemoveOptions{Force: true})
	}()
	res, err := cli.CopyFromContainer(ctx, created.ID, client.CopyFromContainerOptions{SourcePath: dpkgStatusPath})
	if err != nil {
		return nil, fmt.Errorf("base image %s has no %s, so it is not Debian-family: packages need a Debian or Ubuntu base: %w", baseRef, dpkgStatusPath, err)
	}
	defer res.Content.Close()
	tr := tar.NewReader(res.Content)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("base image %s has no %s", baseRef, dpkgStatusPath)
		}
		if err != nil {
			return nil, fmt.Errorf("cannot read the packages of %s: %w", baseRef, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(io.LimitReader(tr, 64<<20))
			if err != nil {
				return nil, fmt.Errorf("cannot read the packages of %s: %w", baseRef, err)
			}
			return data, nil
		}
	}
}

// EngineTimeout bounds every short engine call (inspect, list, remove).
const EngineTimeout = 30 * time.Second

// AptFetcher downloads .debs with the host's apt, resolved against a base
// image's dpkg status: exactly the packages (and dependencies) the base
// lacks, from whatever mirror or proxy the host's apt uses.
type AptFetcher struct {
	// AptGet is the apt-get binary (default: apt-get on PATH).
	AptGet string
}

// HostHasApt tells whether this host can fetch .debs itself.
func HostHasApt() bool {
	_, err := exec.LookPath("apt-get")
	return err == nil
}

var unknownPackage = regexp.MustCompile(`(?m)^E: (Unable to locate package \S+|Package '?\S+'? has no installation candidate)`)

// Fetch downloads packages and what they need beyond status into dir and
// returns the .deb paths. A package the host's apt does not know is an
// error naming it.
func (f AptFetcher) Fetch(ctx context.Context, status []byte, packages []string, dir string, onLine func(string)) ([]string, error) {
	apt := f.AptGet
	if apt == "" {
		apt = "apt-get"
	}
	if err := os.MkdirAll(filepath.Join(dir, "archives", "partial"), 0o755); err != nil {
		return nil, fmt.Errorf("cannot prepare a package directory: %w", err)
	}
	statusFile := filepath.Join(dir, "status")
	if err := os.WriteFile(statusFile, status, 0o644); err != nil {
		return nil, fmt.Errorf("cannot prepare a package directory: %w", err)
	}
	args := []string{"-q", "-y", "--download-only", "--no-install-recommends",
		"-o", "Dir::State::status=" + statusFile,
		// Its caches go to dir too: the service's /var is read-only.
		"-o", "Dir::Cache=" + dir,
		"-o", "Dir::Cache::archives=" + filepath.Join(dir, "archives"),
		// Nothing is installed on the host: no dpkg lock is needed, and the
		// download need not drop to _apt (the service has no setuid).
		"-o", "Debug::NoLocking=1",
		"-o", "APT::Sandbox::User=root",
		"install", "--"}
	cmd := exec.CommandContext(ctx, apt, append(args, packages...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	for line := range strings.SplitSeq(strings.TrimRight(out.String(), "\n"), "\n") {
		if onLine != nil && line != "" {
			onLine("apt: " + line)
		}
	}
	if err != nil {
		if m := unknownPackage.FindStringSubmatch(out.String()); m != nil {
			return nil, fmt.Errorf("package not found by the host's apt: %s (check the name, or run apt-get update on the host)", m[1])
		}
		return nil, fmt.Errorf("cannot fetch packages with the host's apt: %w\n%s", err, lastLines(out.String(), TailLines))
	}
	debs, err := filepath.Glob(filepath.Join(dir, "archives", "*.deb"))
	if err != nil {
		return nil, fmt.Errorf("cannot list fetched packages: %w", err)
	}
	return debs, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
