package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/agent/memory"
	"github.com/berth-dev/berth/agent/provider"
)

// Workspace files the memory and soul tools keep.
const (
	SoulFile   = "SOUL.md"
	MemoryFile = "MEMORY.md"
	UserFile   = "USER.md"
	// NoteFileLimit caps SOUL.md, MEMORY.md and USER.md: they join every
	// system prompt.
	NoteFileLimit = 64 << 10
	// DefaultSearchLimit is memory_search's limit when none is given.
	DefaultSearchLimit = 5
)

type memoryStore struct{ env Env }

func (memoryStore) Spec() provider.Tool {
	return provider.Tool{
		Name:        "memory_store",
		Description: "Remember a fact for later runs (stored in the workspace's memory.db). source says where it came from. Returns the memory's id.",
		Parameters:  schema(`{"type":"object","properties":{"content":{"type":"string"},"source":{"type":"string"}},"required":["content"],"additionalProperties":false}`),
	}
}

func (t memoryStore) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		Content string `json:"content"`
		Source  string `json:"source"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	f, err := t.env.memory().Add(args.Content, args.Source)
	if err != nil {
		return "", fmt.Errorf("cannot store memory: %w", err)
	}
	return fmt.Sprintf("stored memory %s", f.ID), nil
}

type memorySearch struct{ env Env }

func (memorySearch) Spec() provider.Tool {
	return provider.Tool{
		Name:        "memory_search",
		Description: "Search remembered facts by relevance (BM25). Returns JSON: a list of {id, content, source, created_at, score}, best first; limit defaults to 5.",
		Parameters:  schema(`{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer","minimum":1,"maximum":50}},"required":["query"],"additionalProperties":false}`),
	}
}

func (t memorySearch) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		Query string `json:"query"`
		Limit int    `json:"limit"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	if strings.TrimSpace(args.Query) == "" {
		return "", errors.New("bad arguments: query is empty")
	}
	if args.Limit <= 0 {
		args.Limit = DefaultSearchLimit
	}
	results, err := t.env.memory().Search(args.Query, min(args.Limit, 50))
	if err != nil {
		return "", fmt.Errorf("cannot search memory: %w", err)
	}
	if results == nil {
		results = []memory.Result{}
	}
	out, err := json.Marshal(results)
	if err != nil {
		return "", fmt.Errorf("cannot encode results: %w", err)
	}
	return string(out), nil
}

type memoryDelete struct{ env Env }

func (memoryDelete) Spec() provider.Tool {
	return provider.Tool{
		Name:        "memory_delete",
		Description: "Forget the remembered fact with the given id (ids come from memory_store and memory_search).",
		Parameters:  schema(`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`),
	}
}

func (t memoryDelete) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		ID string `json:"id"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	found, err := t.env.memory().Delete(args.ID)
	if err != nil {
		return "", fmt.Errorf("cannot delete memory: %w", err)
	}
	if !found {
		return "", fmt.Errorf("no memory with id %q", args.ID)
	}
	return fmt.Sprintf("deleted memory %s", args.ID), nil
}

func (e Env) memory() *memory.Store {
	return memory.Open(filepath.Join(e.Workspace, memory.FileName))
}

type memoryNote struct{ env Env }

func (memoryNote) Spec() provider.Tool {
	return provider.Tool{
		Name: "memory_note",
		Description: "Add a note to MEMORY.md (what you keep in mind about your work; the default) or USER.md (what you know about the people you talk to). " +
			"Both are part of your instructions in every run. Appends a line; with replace=true the file becomes content. Each file holds at most 64 KiB.",
		Parameters: schema(`{"type":"object","properties":{"file":{"type":"string","enum":["MEMORY.md","USER.md"]},"content":{"type":"string"},"replace":{"type":"boolean"}},"required":["content"],"additionalProperties":false}`),
	}
}

func (t memoryNote) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		File    string `json:"file"`
		Content string `json:"content"`
		Replace bool   `json:"replace"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	name, err := noteFile(args.File)
	if err != nil {
		return "", err
	}
	path := filepath.Join(t.env.Workspace, name)
	text := strings.TrimSpace(args.Content)
	if text == "" && !args.Replace {
		return "", errors.New("bad arguments: content is empty")
	}
	// Read, change and write under the lock: another conversation of the
	// agent may be noting at the same moment.
	unlock, err := memory.LockShared(t.env.Workspace)
	if err != nil {
		return "", err
	}
	defer unlock()
	var next string
	if args.Replace {
		next = text + "\n"
	} else {
		old, err := readSmall(path)
		if err != nil {
			return "", err
		}
		if old != "" && !strings.HasSuffix(old, "\n") {
			old += "\n"
		}
		next = old + "- " + strings.ReplaceAll(text, "\n", "\n  ") + "\n"
	}
	if len(next) > NoteFileLimit {
		return "", fmt.Errorf("%s would grow to %d bytes (limit %d); rewrite it shorter with replace=true", name, len(next), NoteFileLimit)
	}
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		return "", fmt.Errorf("cannot write %s: %w", name, err)
	}
	return fmt.Sprintf("%s now holds %d bytes", name, len(next)), nil
}

type memoryRead struct{ env Env }

func (memoryRead) Spec() provider.Tool {
	return provider.Tool{
		Name:        "memory_read",
		Description: "Read MEMORY.md (the default) or USER.md.",
		Parameters:  schema(`{"type":"object","properties":{"file":{"type":"string","enum":["MEMORY.md","USER.md"]}},"additionalProperties":false}`),
	}
}

func (t memoryRead) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		File string `json:"file"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	name, err := noteFile(args.File)
	if err != nil {
		return "", err
	}
	text, err := readSmall(filepath.Join(t.env.Workspace, name))
	if err != nil {
		return "", err
	}
	if text == "" {
		return fmt.Sprintf("(%s is empty)", name), nil
	}
	return text, nil
}

func noteFile(name string) (string, error) {
	switch strings.ToUpper(strings.TrimSpace(name)) {
	case "", "MEMORY", "MEMORY.MD":
		return MemoryFile, nil
	case "USER", "USER.MD":
		return UserFile, nil
	}
	return "", fmt.Errorf("bad arguments: file must be MEMORY.md or USER.md, not %q", name)
}

type soulRead struct{ env Env }

func (soulRead) Spec() provider.Tool {
	return provider.Tool{
		Name:        "soul_read",
		Description: "Read SOUL.md: who you are and how you work. It opens your instructions in every run.",
		Parameters:  schema(`{"type":"object","properties":{},"additionalProperties":false}`),
	}
}

func (t soulRead) Call(_ context.Context, raw json.RawMessage) (string, error) {
	if err := decodeArgs(raw, &struct{}{}); err != nil {
		return "", err
	}
	return readSmall(filepath.Join(t.env.Workspace, SoulFile))
}

type soulEdit struct{ env Env }

func (soulEdit) Spec() provider.Tool {
	return provider.Tool{
		Name:        "soul_edit",
		Description: "Replace SOUL.md with content (at most 64 KiB). Takes effect from the next run.",
		Parameters:  schema(`{"type":"object","properties":{"content":{"type":"string"}},"required":["content"],"additionalProperties":false}`),
	}
}

func (t soulEdit) Call(_ context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		Content string `json:"content"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	text := strings.TrimSpace(args.Content)
	switch {
	case text == "":
		return "", errors.New("bad arguments: content is empty; SOUL.md cannot be blank")
	case len(text) > NoteFileLimit:
		return "", fmt.Errorf("bad arguments: content is %d bytes (limit %d)", len(text), NoteFileLimit)
	}
	unlock, err := memory.LockShared(t.env.Workspace)
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := os.WriteFile(filepath.Join(t.env.Workspace, SoulFile), []byte(text+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("cannot write %s: %w", SoulFile, err)
	}
	return fmt.Sprintf("SOUL.md now holds %d bytes", len(text)+1), nil
}

// readSmall reads a workspace note file; a missing file is empty.
func readSmall(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("cannot read %s: %w", filepath.Base(path), err)
	}
	if len(data) > NoteFileLimit {
		data = data[:NoteFileLimit]
	}
	return string(data), nil
}
