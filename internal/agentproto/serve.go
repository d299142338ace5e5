package agentproto

// Serve mode (docs/adr/0021-conversation-sandboxes.md): berth-agent run with
// ServeArg as its first argument keeps one confined sandbox and takes one
// Request per line on stdin, answering one Response per line on stdout. The
// first line opens the sandbox and is answered by an empty Response of its
// run id once the agent is confined.
const (
	ServeArg = "serve"
	// ServePIDNamespaceArg follows ServeArg when the agent lives in a PID
	// namespace of its own under an init (a container): at SIGTERM it passes
	// the signal on to every process of the namespace and waits for them.
	ServePIDNamespaceArg = "--pid-namespace"
)
