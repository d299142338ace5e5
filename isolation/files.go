package isolation

import (
	"context"

	"github.com/berth-dev/berth/internal/agentproto"
)

// RunFiles are the files a run's sandbox gets and gives back when its
// workspace is not on the scheduler's host (a Kubernetes pod, ADR 29): the
// backend places In read-only beneath InDir before the agent reads its
// request, and reads the reply's files back, within Out, before the
// sandbox goes. Host backends get none: the scheduler reaches their
// workspace itself.
type RunFiles struct {
	// InDir is In's directory beneath the workspace (inbox/<message id>);
	// berth names it and every file in it, never the sandbox.
	InDir string
	In    []InFile
	// Out bounds the reply's files; a zero File reads none.
	Out FileCaps
}

// InFile is one file of a run's message.
type InFile struct {
	Name string // one path element, as busapi.CleanFileName made it
	Size int64
	Path string // its staged copy on the scheduler's host
}

// FileCaps bound the reply's files: each one, and all of them.
type FileCaps struct{ File, Total int64 }

// SandboxFile is one file of a reply as the backend read it from the
// sandbox: its bytes, or the encoded refusal of the sandbox's helper
// (workspacefile.Refusal.Encode), or Failed when the backend could not ask.
type SandboxFile struct {
	Path    string
	Data    []byte
	Refusal string
	Failed  string
}

// FilesKeeper is a Kept whose workspace is not on the scheduler's host: it
// takes a run's files with its request (RunFiles) and returns the reply's
// files in Result.ReplyFiles.
type FilesKeeper interface {
	Kept
	RunWithFiles(ctx context.Context, req agentproto.Request, files *RunFiles) (Result, error)
}
