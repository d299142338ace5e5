package testkube

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// BusyboxPath is where Debian's busybox-static puts its static busybox.
const BusyboxPath = "/bin/busybox"

// BusyboxImage is the tag of the one-layer image (FROM scratch: /bin/busybox
// and its applets as links) that BusyboxImage builds.
const BusyboxImage = "berth-test/kube-busybox:1"

// Busybox builds BusyboxImage in the local Docker engine from the host's
// static busybox, loads it into the cluster (LoadImage) and returns its name
// for pods with imagePullPolicy Never. The layer is made the same way every
// time (fixed times and order), so its image id, and LoadImage's cache, hold.
func Busybox(t testing.TB) string {
	t.Helper()
	Config(t)
	bin, err := os.ReadFile(BusyboxPath)
	testenv.Need(t, err == nil, "no static busybox at %s (Debian's busybox-static): %v", BusyboxPath, err)
	cli := testdocker.Engine(t)
	if err := loadScratchImage(cli, BusyboxImage, bin); err != nil {
		t.Fatalf("cannot build %s: %v", BusyboxImage, err)
	}
	LoadImage(t, BusyboxImage)
	return BusyboxImage
}

// busyboxApplets are the names the test pods call busybox by.
var busyboxApplets = []string{"sh", "cat", "echo", "wget", "hostname", "id", "ls", "sleep", "true", "false", "ip", "nc"}

func loadScratchImage(cli *client.Client, tag string, busybox []byte) error {
	epoch := time.Unix(0, 0)
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	hdrs := []*tar.Header{
		{Name: "bin/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: epoch},
		{Name: "bin/busybox", Mode: 0o755, Size: int64(len(busybox)), Typeflag: tar.TypeReg, ModTime: epoch},
	}
	for _, a := range busyboxApplets {
		hdrs = append(hdrs, &tar.Header{Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, Typeflag: tar.TypeSymlink, ModTime: epoch})
	}
	hdrs = append(hdrs, &tar.Header{Name: "tmp/", Mode: 0o1777, Typeflag: tar.TypeDir, ModTime: epoch})
	for _, h := range hdrs {
		if err := lw.WriteHeader(h); err != nil {
			return err
		}
		if h.Name == "bin/busybox" {
			if _, err := lw.Write(busybox); err != nil {
				return err
			}
		}
	}
	if err := lw.Close(); err != nil {
		return err
	}
	sum := sha256.Sum256(layer.Bytes())
	cfg, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{"Cmd": []string{"/bin/sh"}, "Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(sum[:])}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{tag}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return err
	}
	var archive bytes.Buffer
	aw := tar.NewWriter(&archive)
	for _, f := range []struct {
		name string
		data []byte
	}{{"layer.tar", layer.Bytes()}, {"config.json", cfg}, {"manifest.json", manifest}} {
		if err := aw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg, ModTime: epoch}); err != nil {
			return err
		}
		if _, err := aw.Write(f.data); err != nil {
			return err
		}
	}
	if err := aw.Close(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cli.ImageLoad(ctx, &archive, client.ImageLoadWithQuiet(true))
	if err != nil {
		return fmt.Errorf("docker load: %w", err)
	}
	defer res.Close()
	_, err = io.Copy(io.Discard, res)
	return err
}
