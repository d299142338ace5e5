package testdocker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"testing"

	"github.com/moby/moby/client"
)

// ForeignImage loads a one-file image that claims arch (another
// architecture than the engine's) and returns its tag.
func ForeignImage(t *testing.T, cli *client.Client, arch string) string {
	t.Helper()
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	lw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o755, Size: 2, Typeflag: tar.TypeReg})
	lw.Write([]byte("hi"))
	lw.Close()
	sum := sha256.Sum256(layer.Bytes())
	cfg, _ := json.Marshal(map[string]any{
		"architecture": arch, "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/hello"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(sum[:])}},
	})
	tag := "berth-test-foreign:" + arch
	manifest, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{tag}, "Layers": []string{"layer.tar"}}})
	var archive bytes.Buffer
	aw := tar.NewWriter(&archive)
	for _, f := range []struct {
		name string
		data []byte
	}{{"layer.tar", layer.Bytes()}, {"config.json", cfg}, {"manifest.json", manifest}} {
		aw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg})
		aw.Write(f.data)
	}
	aw.Close()
	res, err := cli.ImageLoad(context.Background(), &archive, client.ImageLoadWithQuiet(true))
	if err != nil {
		t.Fatalf("cannot load a foreign image: %v", err)
	}
	io.Copy(io.Discard, res)
	res.Close()
	return tag
}
