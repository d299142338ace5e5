// Package imagectl defines berth's container images and builds them through
// the Docker Engine API, offline: the build context is a tar made here, the
// base is scratch, nothing is pulled. An image's tag carries the hash of
// everything that went into it, so a changed berth-agent is a new image and
// an unchanged one is never rebuilt.
package imagectl

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Repository is the name of the agent image; the tag is its content hash.
const Repository = "berth-agent"

// LabelHash is the image label holding the full content hash.
const LabelHash = "dev.berth.image-hash"

// AgentBinaryPath is where berth-agent lives inside the image.
const AgentBinaryPath = "/usr/libexec/berth/berth-agent"

// DefaultBusybox is where Debian's busybox-static installs busybox.
const DefaultBusybox = "/bin/busybox"

// AgentImage is the minimal image a container agent runs in: FROM scratch,
// the static berth-agent, and a static busybox for /bin/sh and the usual
// tools. Nothing else: no package manager, no libc, no shell history.
type AgentImage struct {
	AgentBinary string // a statically linked berth-agent
	Busybox     string // a statically linked busybox; "" means DefaultBusybox
}

// Dockerfile is the image's recipe; the rootfs/ tree comes from Context.
func (a AgentImage) Dockerfile() string {
	return `FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin
WORKDIR /workspace
ENTRYPOINT ["` + AgentBinaryPath + `"]
`
}

func (a AgentImage) busybox() string {
	if a.Busybox == "" {
		return DefaultBusybox
	}
	return a.Busybox
}

// entry is one file of the build context.
type entry struct {
	name   string
	mode   int64
	dir    bool
	link   string
	source string // host file to copy
	data   []byte
}

// entries lists the build context. It checks that both binaries are static:
// a dynamic one would fail inside scratch with a confusing "no such file".
func (a AgentImage) entries() ([]entry, error) {
	for _, bin := range []struct{ path, hint string }{
		{a.AgentBinary, "build it with CGO_ENABLED=0"},
		{a.busybox(), "install Debian's busybox-static (apt-get install busybox-static)"},
	} {
		if err := checkStatic(bin.path); err != nil {
			return nil, fmt.Errorf("%w; %s", err, bin.hint)
		}
	}
	out, err := exec.Command(a.busybox(), "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("cannot list the applets of %s: %w", a.busybox(), err)
	}
	applets := strings.Fields(string(out))
	sort.Strings(applets)

	es := []entry{
		{name: "Dockerfile", mode: 0o644, data: []byte(a.Dockerfile())},
		{name: "rootfs/", mode: 0o755, dir: true},
		{name: "rootfs/bin/", mode: 0o755, dir: true},
		{name: "rootfs/bin/busybox", mode: 0o755, source: a.busybox()},
	}
	for _, name := range applets {
		if name != "busybox" && !strings.Contains(name, "/") {
			es = append(es, entry{name: "rootfs/bin/" + name, mode: 0o777, link: "busybox"})
		}
	}
	es = append(es,
		entry{name: "rootfs/etc/", mode: 0o755, dir: true},
		entry{name: "rootfs/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		entry{name: "rootfs/etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		entry{name: "rootfs/tmp/", mode: 0o1777, dir: true},
		entry{name: "rootfs/workspace/", mode: 0o755, dir: true},
		entry{name: "rootfs/usr/", mode: 0o755, dir: true},
		entry{name: "rootfs/usr/bin/", mode: 0o755, dir: true},
		entry{name: "rootfs/usr/libexec/", mode: 0o755, dir: true},
		entry{name: "rootfs/usr/libexec/berth/", mode: 0o755, dir: true},
		entry{name: "rootfs" + AgentBinaryPath, mode: 0o755, source: a.AgentBinary},
	)
	return es, nil
}

// checkStatic fails unless path is an ELF executable without an interpreter.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not an executable: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked and cannot run in a scratch image", path)
		}
	}
	return nil
}

// Context writes the build context as a tar and returns the image's content
// hash: SHA-256 over every entry's name, mode, link and bytes.
func (a AgentImage) Context(w io.Writer) (string, error) {
	es, err := a.entries()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	tw := tar.NewWriter(w)
	for _, e := range es {
		data := e.data
		if e.source != "" {
			if data, err = os.ReadFile(e.source); err != nil {
				return "", fmt.Errorf("cannot read %s: %w", e.source, err)
			}
		}
		hdr := &tar.Header{Name: e.name, Mode: e.mode, Format: tar.FormatPAX}
		switch {
		case e.dir:
			hdr.Typeflag = tar.TypeDir
		case e.link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		}
		fmt.Fprintf(h, "%s\x00%o\x00%s\x00%d\x00", e.name, e.mode, e.link, len(data))
		h.Write(data)
		if err := tw.WriteHeader(hdr); err != nil {
			return "", fmt.Errorf("cannot write build context: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return "", fmt.Errorf("cannot write build context: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("cannot write build context: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Tag is the image reference for a content hash.
func Tag(hash string) string {
	return Repository + ":" + hash[:16]
}

// Ensure returns the tag of the agent image, building it first when the
// engine does not have it yet.
func Ensure(ctx context.Context, cli *client.Client, a AgentImage) (string, error) {
	var buf bytes.Buffer
	hash, err := a.Context(&buf)
	if err != nil {
		return "", fmt.Errorf("cannot prepare the agent image: %w", err)
	}
	tag := Tag(hash)
	if _, err := cli.ImageInspect(ctx, tag); err == nil {
		return tag, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("cannot inspect image %s: %w", tag, err)
	}
	if err := Build(ctx, cli, &buf, tag, map[string]string{LabelHash: hash}); err != nil {
		return "", err
	}
	return tag, nil
}

// Build sends a tar build context to the engine's classic builder and waits
// for the result, failing with the builder's own message.
func Build(ctx context.Context, cli *client.Client, buildContext io.Reader, tag string, labels map[string]string) error {
	res, err := cli.ImageBuild(ctx, buildContext, client.ImageBuildOptions{
		Tags:        []string{tag},
		Labels:      labels,
		Remove:      true,
		ForceRemove: true,
		NetworkMode: "none",
	})
	if err != nil {
		return fmt.Errorf("cannot build image %s: %w", tag, err)
	}
	defer res.Body.Close()
	dec := json.NewDecoder(res.Body)
	var log strings.Builder
	for {
		var msg struct {
			Stream      string `json:"stream"`
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("cannot read the build of %s: %w", tag, err)
		}
		log.WriteString(msg.Stream)
		if msg.Error != "" {
			return fmt.Errorf("cannot build image %s: %s\n%s", tag, msg.Error, log.String())
		}
	}
	if _, err := cli.ImageInspect(ctx, tag); err != nil {
		return fmt.Errorf("image %s is missing after its build: %w\n%s", tag, err, log.String())
	}
	return nil
}
