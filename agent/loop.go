package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berth-dev/berth/agent/confine"
	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/agent/provider"
	"github.com/berth-dev/berth/agent/skills"
	"github.com/berth-dev/berth/agent/tools"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// promptFileLimit caps each workspace file read into the system prompt.
const promptFileLimit = 256 << 10

// run enters the workspace and runs the model/tool loop. It is called only
// once the process is confined (or deliberately unrestricted); tool
// processes start through launcher (nil when unrestricted).
func run(ctx context.Context, req agentproto.Request, launcher *confine.Launcher, log *slog.Logger) (agentproto.Response, int) {
	resp := agentproto.Response{Version: agentproto.Version, RunID: req.RunID}
	fail := func(code int, reply string, err error) (agentproto.Response, int) {
		resp.Reply, resp.Error = reply, err.Error()
		log.Error("run failed", "err", resp.Error)
		return resp, code
	}

	if err := os.Chdir(req.Workspace); err != nil {
		return fail(agentproto.ExitInternal, "The agent could not enter its workspace.", fmt.Errorf("cannot enter workspace: %w", err))
	}
	tmp := toolsTmpDir(req)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		log.Warn("cannot create TMPDIR for tools", "dir", tmp, "err", err.Error())
	}
	if req.Probe {
		return probe(ctx, req, log), agentproto.ExitOK
	}
	if req.ProbeMCP {
		return probeMCP(ctx, req, toolEnv(req, tmp, launcher), log), agentproto.ExitOK
	}

	llm, err := newChain(req.Provider, req.Fallback, log)
	if err != nil {
		return fail(agentproto.ExitAgentError, "The agent has no usable model provider.", err)
	}
	ensureSoul(req, log)
	env := toolEnv(req, tmp, launcher)
	env.Outbox = tools.NewOutbox()
	// MCP servers start (stdio ones in the tools' domain) before the first
	// model call, which needs their tools; they end with the run.
	mcpServers := tools.ConnectMCP(ctx, env, req.MCP, log)
	defer mcpServers.Close()
	resp.MCP = mcpServers.Status()
	available := slices.Concat(tools.Builtin(env), tools.WebSearch(env, req.WebSearch), mcpServers.Tools())
	set := tools.Filter(available, req.Agent.Tools.Allow, req.Agent.Tools.Deny)
	all, errs := skills.Load(req.Workspace)
	for _, err := range errs {
		log.Warn("skill left out", "err", err.Error())
	}
	active := skills.Match(all, req.Message.Text)
	if names, ok := skills.Tools(active); ok {
		set = set.Restrict(names)
	}
	for _, sk := range active {
		log.Info("skill active", "skill", sk.Name, "tools", sk.Tools)
	}
	asks, err := toolAsks(req)
	if err != nil {
		return fail(agentproto.ExitAgentError, "The agent's [agents.tools] ask rules cannot be read.", err)
	}
	set = set.Asking(asks, toolAsker(req))
	specs := set.Specs()

	conv := provider.Conversation{System: systemPrompt(req, all, active, log)}
	if note := mcpServers.PromptNote(); note != "" {
		conv.System += "\n\n" + note
	}
	for _, t := range req.History {
		conv.Messages = append(conv.Messages, provider.Message{Role: provider.Role(t.Role), Text: t.Text})
	}
	conv.Messages = append(conv.Messages, provider.Message{Role: provider.RoleUser, Text: req.Message.Text + filesNote(req.Message.Files)})

	maxIter := req.Agent.MaxIterations
	if maxIter == 0 {
		maxIter = DefaultMaxIterations
	}
	progress := newProgressReporter(log)
	spans := startSpans(&resp, req) // ADR 25: the loop's spans, in the response
	for i := 1; i <= maxIter; i++ {
		if err := ctx.Err(); err != nil {
			return fail(agentproto.ExitAgentError, "The run was interrupted.", fmt.Errorf("interrupted: %w", err))
		}
		llmSpan := spans.llm(i, req.Provider)
		turn, usage, err := llm.Complete(ctx, &conv, specs)
		spans.llmDone(llmSpan, usage, err)
		resp.Usage.Iterations = i
		resp.Usage.InputTokens += usage.InputTokens
		resp.Usage.OutputTokens += usage.OutputTokens
		if err != nil {
			return fail(agentproto.ExitAgentError, "The model could not be reached.", err)
		}
		conv.Messages = append(conv.Messages, provider.Message{Role: provider.RoleAssistant, Text: turn.Text, ToolCalls: turn.ToolCalls})
		if len(turn.ToolCalls) == 0 {
			resp.Reply = turn.Text
			resp.Files = env.Outbox.Files(req.Workspace)
			return resp, agentproto.ExitOK
		}
		for _, call := range turn.ToolCalls {
			progress.toolStarted(call.Name, call.Args)
			toolSpan := spans.tool(call.Name)
			// A call an ask rule matches runs only once a person allowed it.
			approval, err := set.Ask(ctx, call.Name, call.Args)
			var out string
			if err == nil {
				out, err = set.Call(ctx, call.Name, call.Args)
			}
			spans.toolDone(toolSpan, err)
			record := agentproto.ToolCall{Name: call.Name, Args: recordableArgs(call.Args), Output: out, Approval: approval}
			result := provider.Message{Role: provider.RoleTool, ToolCallID: call.ID, ToolName: call.Name, Text: out}
			if err != nil {
				record.Error, result.Text, result.IsError = err.Error(), err.Error(), true
			}
			log.Info("tool call", "tool", call.Name, "failed", err != nil)
			resp.ToolCalls = append(resp.ToolCalls, record)
			conv.Messages = append(conv.Messages, result)
		}
	}
	return fail(agentproto.ExitAgentError,
		fmt.Sprintf("I stopped after %d steps without reaching an answer.", maxIter),
		fmt.Errorf("max iterations (%d) reached", maxIter))
}

// toolAsks are the request's [agents.tools] ask rules, checked when the
// config was loaded.
func toolAsks(req agentproto.Request) ([]egresspolicy.ToolRule, error) {
	var rules []egresspolicy.ToolRule
	for _, s := range req.Agent.Tools.Ask {
		r, err := egresspolicy.ParseToolRule(s)
		if err != nil {
			return nil, fmt.Errorf("tools.ask %q: %w", s, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// toolAsker asks through the run's egress proxy, on the agent's own
// channel; nil (every asked call denied) for a run without one.
func toolAsker(req agentproto.Request) tools.AskFunc {
	if req.Egress == nil {
		return nil
	}
	if ask := agentegress.ToolAsker(*req.Egress); ask != nil {
		return ask
	}
	return nil
}

// recordableArgs keeps the model's arguments in the response; text that is
// not JSON is kept as a JSON string so the response stays valid.
func recordableArgs(args json.RawMessage) json.RawMessage {
	if len(args) == 0 || json.Valid(args) {
		return args
	}
	quoted, _ := json.Marshal(string(args))
	return quoted
}

// defaultSoul is the SOUL.md an agent starts with.
func defaultSoul(req agentproto.Request) string {
	name := req.Agent.Name
	if name == "" {
		name = req.Agent.ID
	}
	if name == "" {
		name = "berth agent"
	}
	return fmt.Sprintf("# %s\n\n"+
		"You are %s, an assistant that answers chat messages.\n"+
		"You work in a sandboxed workspace and can use the tools you are given.\n"+
		"Be brief and concrete. Say so when you are unsure or a tool failed.\n"+
		"Keep lasting facts with memory_store and memory_note; look them up with memory_search.\n", name, name)
}

// ensureSoul writes the default SOUL.md on the first run of an agent, so
// the admin (and soul_edit) has a file to start from. The scheduler makes
// the workspace directory; the agent fills it.
func ensureSoul(req agentproto.Request, log *slog.Logger) {
	f, err := os.OpenFile(tools.SoulFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return
	}
	if err != nil {
		log.Warn("cannot create SOUL.md", "err", err.Error())
		return
	}
	defer f.Close()
	if _, err := f.WriteString(defaultSoul(req)); err != nil {
		log.Warn("cannot write SOUL.md", "err", err.Error())
	}
}

// systemPrompt is SOUL.md (or the default text), MEMORY.md and USER.md when
// they exist, a list of the workspace's skills, and the bodies of the
// skills the message activated.
func systemPrompt(req agentproto.Request, all, active []skills.Skill, log *slog.Logger) string {
	soul, ok := readPromptFile(tools.SoulFile, log)
	if !ok || strings.TrimSpace(soul) == "" {
		soul = defaultSoul(req)
	}
	parts := []string{strings.TrimSpace(soul)}
	for _, name := range []string{tools.MemoryFile, tools.UserFile} {
		if text, ok := readPromptFile(name, log); ok && strings.TrimSpace(text) != "" {
			parts = append(parts, fmt.Sprintf("# %s\n\n%s", name, strings.TrimSpace(text)))
		}
	}
	if len(all) > 0 {
		var b strings.Builder
		b.WriteString("# Skills\n")
		for _, sk := range all {
			fmt.Fprintf(&b, "\n- %s: %s", sk.Name, sk.Description)
		}
		parts = append(parts, b.String())
	}
	for _, sk := range active {
		parts = append(parts, fmt.Sprintf("# Skill: %s (active for this message)\n\n%s", sk.Name, sk.Body))
	}
	return strings.Join(parts, "\n\n")
}

func readPromptFile(name string, log *slog.Logger) (string, bool) {
	f, err := os.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if err != nil {
		log.Warn("cannot read prompt file", "file", name, "err", err.Error())
		return "", false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, promptFileLimit))
	if err != nil {
		log.Warn("cannot read prompt file", "file", name, "err", err.Error())
		return "", false
	}
	return string(data), true
}

// newChain builds the provider chain: the primary, then each fallback. A
// provider that cannot be built (unknown kind, no model) is left out and
// the error kept for when none is left.
func newChain(primary agentproto.Provider, fallback []agentproto.Provider, log *slog.Logger) (*provider.Chain, error) {
	c := &provider.Chain{Log: log}
	var errs []error
	for _, cfg := range append([]agentproto.Provider{primary}, fallback...) {
		p, err := provider.New(cfg)
		if err != nil {
			errs = append(errs, err)
			log.Warn("provider left out", "provider", cfg.Name, "err", err.Error())
			continue
		}
		c.Providers = append(c.Providers, provider.Named{Name: cfg.Name, Provider: p})
	}
	if len(c.Providers) == 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// toolsTmpDir is the tools' TMPDIR. A confined host run and a container
// have a private /tmp of their own (256 MiB, gone with the run), which the
// runner grants read-write: temporary files belong there, not in the
// workspace the next run sees. An unrestricted run, or one whose runner
// gave it no /tmp, shares the host's: it keeps <workspace>/.tmp.
func toolsTmpDir(req agentproto.Request) string {
	if !req.Policy.Unrestricted && slices.ContainsFunc(req.Policy.AllowReadWrite, func(p string) bool { return filepath.Clean(p) == "/tmp" }) {
		return "/tmp"
	}
	return filepath.Join(req.Workspace, ".tmp")
}

// filesNote lists a message's attachments for the model: where each is in
// the workspace (read-only), its type and size.
func filesNote(files []agentproto.MessageFile) string {
	if len(files) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n\n[Attached files, read-only in the workspace:")
	for _, f := range files {
		typ := f.Type
		if typ == "" {
			typ = "unknown type"
		}
		fmt.Fprintf(&b, "\n- %s (%s, %d bytes)", f.Path, typ, f.Size)
	}
	b.WriteString("]")
	return b.String()
}
