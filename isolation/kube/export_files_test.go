package kube

import (
	"context"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// TakeFiles asks a kept pod's files-out helper for want, as a subverted
// agent could name them (the agent itself lists regular files only).
func TakeFiles(ctx context.Context, k isolation.Kept, want []agentproto.OutFile, caps isolation.FileCaps) []isolation.SandboxFile {
	return k.(filesKept).s.takeFiles(ctx, want, caps)
}
