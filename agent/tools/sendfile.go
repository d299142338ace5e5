package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/berth-dev/berth/agent/provider"
	"github.com/berth-dev/berth/internal/agentproto"
)

// MaxCaption is the longest caption send_file keeps (bytes).
const MaxCaption = 1000

// Outbox gathers the files a run's reply carries: those send_file was
// given and, at the end, the regular files left in agentproto.OutboxDir.
// Only paths are kept; the scheduler reads the files after the run.
type Outbox struct {
	mu    sync.Mutex
	files []agentproto.OutFile
}

// NewOutbox is an empty outbox.
func NewOutbox() *Outbox { return &Outbox{} }

// add records rel (relative to the workspace) once; a second send of the
// same file keeps the first caption unless it had none.
func (o *Outbox) add(rel, caption string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if i := slices.IndexFunc(o.files, func(f agentproto.OutFile) bool { return f.Path == rel }); i >= 0 {
		if o.files[i].Caption == "" {
			o.files[i].Caption = caption
		}
		return nil
	}
	if len(o.files) >= agentproto.MaxOutFiles {
		return fmt.Errorf("a reply carries at most %d files; %s was not added", agentproto.MaxOutFiles, rel)
	}
	o.files = append(o.files, agentproto.OutFile{Path: rel, Caption: caption})
	return nil
}

// Files is what the reply carries: the files sent, then the regular files
// directly in workspace/outbox (sorted by name, symlinks and directories
// left out), at most agentproto.MaxOutFiles in all.
func (o *Outbox) Files(workspace string) []agentproto.OutFile {
	entries, _ := os.ReadDir(filepath.Join(workspace, agentproto.OutboxDir))
	for _, e := range entries {
		if e.Type().IsRegular() {
			_ = o.add(agentproto.OutboxDir+"/"+e.Name(), "")
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.files)
}

type sendFile struct{ env Env }

func (sendFile) Spec() provider.Tool {
	return provider.Tool{
		Name: "send_file",
		Description: "Attach a file of the workspace to your reply; the user gets it as an upload when you answer. " +
			"The path is relative to the workspace (or absolute inside it) and the file must exist. " +
			"Files you leave in outbox/ are attached too. Text files have known secrets redacted; each platform has a size limit, and a file over it is left out with a note.",
		Parameters: schema(`{"type":"object","properties":{"path":{"type":"string"},"caption":{"type":"string"}},"required":["path"],"additionalProperties":false}`),
	}
}

func (t sendFile) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		Path    string `json:"path"`
		Caption string `json:"caption"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	if t.env.Outbox == nil {
		return "", errors.New("this run cannot send files")
	}
	rel, err := t.env.workspaceRelative(args.Path)
	if err != nil {
		return "", err
	}
	info, err := os.Lstat(filepath.Join(t.env.Workspace, rel))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("%s does not exist; write it first", args.Path)
	case err != nil:
		return "", fmt.Errorf("cannot send %s: %w", args.Path, err)
	case info.Mode()&os.ModeSymlink != 0:
		return "", fmt.Errorf("%s is a symbolic link; send the file it points to", args.Path)
	case !info.Mode().IsRegular():
		return "", fmt.Errorf("%s is not a regular file", args.Path)
	}
	caption := strings.TrimSpace(args.Caption)
	if len(caption) > MaxCaption {
		caption = caption[:MaxCaption]
		for !utf8.ValidString(caption) {
			caption = caption[:len(caption)-1]
		}
	}
	if err := t.env.Outbox.add(rel, CleanText(caption)); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s (%d bytes) will be attached to your reply.", rel, info.Size()), nil
}

// workspaceRelative is path (relative to the workspace, or absolute inside
// it) as a clean slash-separated path relative to the workspace, its
// parent directories' symlinks resolved; the file itself is not followed.
func (e Env) workspaceRelative(path string) (string, error) {
	if path == "" {
		return "", errors.New("bad arguments: path is empty")
	}
	ws, err := resolveExisting(e.Workspace)
	if err != nil {
		return "", err
	}
	full := path
	if !filepath.IsAbs(full) {
		full = filepath.Join(e.Workspace, full)
	}
	full = filepath.Clean(full)
	dir, err := resolveExisting(filepath.Dir(full))
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(ws, filepath.Join(dir, filepath.Base(full)))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%s is outside the workspace; only workspace files can be sent", path)
	}
	return filepath.ToSlash(rel), nil
}
