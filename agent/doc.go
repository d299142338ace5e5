// Package agent is berth-agent: it runs one agent request inside a sandbox.
//
// It reads one agentproto.Request (JSON, at most 16 MiB) on stdin, confines
// itself with Landlock (package confine) before it opens any file or starts
// any tool — unless the policy is Unrestricted — enters the workspace, builds
// the system prompt from the workspace's SOUL.md (plus MEMORY.md and USER.md
// when present; a default text when SOUL.md is missing), runs the model/tool
// loop and writes one agentproto.Response on stdout. Logs go to stderr as
// JSON lines (log/slog); the provider key never appears in them, nor in the
// environment of tools.
//
// # Exit codes
//
//	0 ExitOK          response written, Response.Error empty
//	1 ExitAgentError  response written, Response.Error says what failed: every
//	                  provider failed, "max iterations (N) reached", interrupted
//	2 ExitBadRequest  stdin was not one valid request of version 1 (unknown
//	                  fields, trailing data, missing run_id or workspace,
//	                  relative policy paths); nothing written on stdout
//	3 ExitConfinement the policy could not be enforced (no Landlock, ABI < 4
//	                  with network=false, a Landlock call failed) or the
//	                  request's egress proxy could not be started (loopback
//	                  down and no CAP_NET_ADMIN to raise it, the port taken);
//	                  nothing ran, nothing written on stdout, the reason is on
//	                  stderr
//	4 ExitInternal    unexpected failure (workspace missing, panic); a
//	                  response is written when possible
//
// # Confinement
//
// Deny beats allow_read_write beats allow_read. The agent uses the full
// rights of the highest Landlock ABI the kernel offers; it needs ABI 1 for
// files and ABI 4 when network is false (TCP bind and connect denied except
// connect to ConnectPorts). Denied paths are carved out of allowed
// directories by confine.Plan. The agent also grants itself read and
// execute on its own executable. Just before Landlock restricts its threads
// it loads its syscall filter (confine.InstallFilter: assembled at build
// time, loaded with TSYNC, which also gives no_new_privs to every thread).
//
// Tools cannot read the agent: berth-agent makes itself non-dumpable before
// it reads stdin, and every tool process runs in a nested Landlock domain —
// the agent's policy without the agent's own /proc entry — that it enters
// by exec'ing berth-agent as the tool launcher (confine.Launcher, see
// docs/adr/0009). From a tool, reading /proc/<agent pid>/mem, environ,
// cmdline, status or fd/, and ptrace-attaching to the agent, all fail, for
// root too. In-process tools refuse paths into the agent's /proc entry.
// Unrestricted runs keep only the non-dumpable flag.
//
// # Egress
//
// A run without a network of its own gets Request.Egress
// (docs/adr/0011-egress-gateway.md). Before it confines itself the agent
// brings the namespace's loopback up when it is down (possible only with
// CAP_NET_ADMIN there; the capabilities are dropped right after, on every
// thread, so no tool inherits them), binds Egress.ProxyAddr (agent/egress)
// and serves it until the run ends; Landlock then allows TCP connect to
// that port only. Its providers come with Proxied set and no key: their
// base URL is the proxy, which adds the key on the way out. Tools get
// HTTP_PROXY, HTTPS_PROXY, NO_PROXY (both cases), npm's variables and, when
// the run has a CA bundle, SSL_CERT_FILE and friends; web_fetch goes
// through the proxy and trusts that bundle. No tool sees the run's token.
//
// Every text of the response (reply, error, tool calls) is valid UTF-8
// without NUL: invalid bytes and NUL become U+FFFD, so a reply can always
// cross D-Bus.
//
// The test-only environment variable
// BERTH_TEST_LANDLOCK_ABI=N caps the ABI the agent believes the kernel has;
// it can only lower it, so it can only make a run fail.
//
// # The local provider
//
// Provider kind "local" is offline and deterministic; it answers the last
// user message:
//
//	"/sh COMMAND"      runs COMMAND with the shell tool, then replies
//	                   "$ COMMAND\n" + STDOUT + "\n[stderr]\n" + STDERR + "\n[exit code N]"
//	                   with STDOUT and STDERR verbatim as the tool returned them
//	                   (each capped at 64 KiB with a truncation marker). When the
//	                   shell tool is filtered out by the agent's tools allow/deny, it
//	                   replies: cannot run "COMMAND": the shell tool is denied for this
//	                   agent (tools allow/deny)
//	"/tool NAME ARGS"  calls tool NAME with the raw argument text ARGS, then replies
//	                   "[NAME]\n" + OUTPUT or "[NAME error]\n" + ERROR
//	anything else      "SOUL: you said: TEXT", SOUL being the first non-empty line of
//	                   SOUL.md without leading '#'
//
// # Real providers
//
// Kind "openai" speaks chat completions through github.com/openai/openai-go/v3
// (OpenAI itself, or any compatible server — Ollama, vLLM, llama.cpp — named
// by base_url); kind "anthropic" speaks the messages API through
// github.com/anthropics/anthropic-sdk-go/v2. Tools are offered as function
// tools / tool_use blocks and results go back as tool messages /
// tool_result blocks. The SDKs' own retries and environment lookups are off:
// the key comes from the request only and provider.Chain decides:
//
//   - connection errors, 408, 409, 429 and 5xx are retried 3 times in all,
//     1 s then 2 s apart (doubling, capped at 30 s); Retry-After and
//     retry-after-ms replace the computed delay, and a server asking for
//     more than 30 s is not waited for; then the next provider is tried;
//   - a context overflow (400/413 saying so) compacts the conversation and
//     retries the same provider once: the history before the current
//     message is dropped (the system prompt says so) and earlier tool
//     results of this run are cut to 2 KiB; it is logged with what was
//     dropped;
//   - anything else (401, 404 model, bad request) ends the run: falling
//     through would hide a configuration mistake.
//
// A provider whose kind is unknown or that has no model is left out of the
// chain ("provider kind X not available in this build").
//
// # Workspace, tools and skills
//
// On first use the agent writes a default SOUL.md (named after the agent);
// MEMORY.md and USER.md appear with the first memory_note; memory.db (see
// package memory) with the first memory_store. Skills (package skills) whose
// triggers occur in the message join the system prompt and, when they list
// tools, restrict the tool set for this run.
//
// # Serve mode
//
// Run as "berth-agent serve" it keeps one sandbox: it confines itself from
// the first request line on stdin, answers it with an empty response, then
// runs one request per line and answers each with one response line, in
// that same confinement (a request asking for another is refused), until
// EOF or SIGTERM (see serve.go and docs/adr/0021-conversation-sandboxes.md).
//
// # Environment
//
// BERTH_LOG_LEVEL=debug|info|warn|error sets the log level (default info).
package agent
