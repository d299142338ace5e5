// Package hostsandbox is what a confined host run's sandbox is made of, as
// both sides that build it see it: the directories masked with empty tmpfs
// and the paths bound back into them, the masking mount code itself, the
// run's scratch /tmp, and which syscalls berth-agent's filter refuses.
//
// The host (isolation/hostrun: a root scheduler's locked thread, or a
// transient unit's TemporaryFileSystem=) and the sandbox (agent/confine:
// berth-agent masking itself in a user namespace of its own) import this
// leaf; neither imports the other. It links no Landlock, no seccomp
// assembler and no LLM SDK: only internal/agentproto and x/sys/unix.
package hostsandbox
