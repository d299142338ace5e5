package agentproto

// A pod's files (docs/adr/0029-kubernetes-workspace.md): every berth pod
// has a second container, "files", running berth-agent with FilesWaitArg
// and the workspace mounted, so the workspace stays reachable before the
// agent has its request and after it has answered. berth execs into it:
//
//	berth-agent files-in <workspace> <dir>   stdin: a tar of regular files,
//	                                         unpacked read-only beneath <dir>
//	berth-agent files-out <workspace>        stdin: one FilesOutRequest;
//	                                         stdout: a tar, entry i for path i
const (
	FilesWaitArg = "files-wait"
	FilesInArg   = "files-in"
	FilesOutArg  = "files-out"
	// FilesRefusalRecord is the PAX record of a files-out entry whose file
	// was refused (workspacefile.Refusal.Encode); such an entry has no bytes.
	FilesRefusalRecord = "BERTH.refusal"
)

// FilesOutRequest asks files-out for a reply's files, each at most File
// bytes and all of them at most Total.
type FilesOutRequest struct {
	Paths []string `json:"paths"`
	File  int64    `json:"file"`
	Total int64    `json:"total"`
}
