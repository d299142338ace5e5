package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/agent/provider"
)

// ReadFileLimit is how many bytes read_file returns at most.
const ReadFileLimit = 256 << 10

type readFile struct{ env Env }

func (readFile) Spec() provider.Tool {
	return provider.Tool{
		Name:        "read_file",
		Description: "Read a text file. Relative paths are inside the workspace. Returns at most 256 KiB.",
		Parameters:  schema(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}`),
	}
}

func (t readFile) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		Path string `json:"path"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	path, err := t.env.resolve(args.Path)
	if err != nil {
		return "", err
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("cannot read file: %w", err)
	}
	defer f.Close()
	out := &capped{limit: ReadFileLimit}
	if _, err := io.Copy(out, f); err != nil {
		return "", fmt.Errorf("cannot read file: %w", err)
	}
	return out.String(), nil
}

type writeFile struct{ env Env }

func (writeFile) Spec() provider.Tool {
	return provider.Tool{
		Name:        "write_file",
		Description: "Write content to a file, replacing it, creating missing parent directories. Relative paths are inside the workspace.",
		Parameters:  schema(`{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"],"additionalProperties":false}`),
	}
}

func (t writeFile) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		Path    string  `json:"path"`
		Content *string `json:"content"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	if args.Content == nil {
		return "", fmt.Errorf("bad arguments: content is missing")
	}
	path, err := t.env.resolve(args.Path)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("cannot create parent directory: %w", err)
	}
	if err := os.WriteFile(path, []byte(*args.Content), 0o644); err != nil {
		return "", fmt.Errorf("cannot write file: %w", err)
	}
	return fmt.Sprintf("wrote %d bytes to %s", len(*args.Content), path), nil
}

type listDir struct{ env Env }

func (listDir) Spec() provider.Tool {
	return provider.Tool{
		Name:        "list_dir",
		Description: "List a directory, one entry per line, directories ending in '/'. Relative paths are inside the workspace; the default is the workspace.",
		Parameters:  schema(`{"type":"object","properties":{"path":{"type":"string"}},"additionalProperties":false}`),
	}
}

func (t listDir) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		Path string `json:"path"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	if args.Path == "" {
		args.Path = "."
	}
	path, err := t.env.resolve(args.Path)
	if err != nil {
		return "", err
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return "", fmt.Errorf("cannot list directory: %w", err)
	}
	var b strings.Builder
	for _, e := range entries {
		b.WriteString(e.Name())
		if e.IsDir() {
			b.WriteByte('/')
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}
