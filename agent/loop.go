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
	"strings"

	"github.com/berth-dev/berth/agent/provider"
	"github.com/berth-dev/berth/agent/tools"
	"github.com/berth-dev/berth/internal/agentproto"
)

// promptFileLimit caps each workspace file read into the system prompt.
const promptFileLimit = 256 << 10

// run enters the workspace and runs the model/tool loop. It is called only
// once the process is confined (or deliberately unrestricted).
func run(ctx context.Context, req agentproto.Request, log *slog.Logger) (agentproto.Response, int) {
	resp := agentproto.Response{Version: agentproto.Version, RunID: req.RunID}
	fail := func(code int, reply string, err error) (agentproto.Response, int) {
		resp.Reply, resp.Error = reply, err.Error()
		log.Error("run failed", "err", resp.Error)
		return resp, code
	}

	if err := os.Chdir(req.Workspace); err != nil {
		return fail(agentproto.ExitInternal, "The agent could not enter its workspace.", fmt.Errorf("cannot enter workspace: %w", err))
	}
	tmp := filepath.Join(req.Workspace, ".tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		log.Warn("cannot create TMPDIR for tools", "dir", tmp, "err", err.Error())
	}

	llm, err := newChain(req.Provider, req.Fallback)
	if err != nil {
		return fail(agentproto.ExitAgentError, "The agent has no usable model provider.", err)
	}
	set := tools.Filter(tools.Builtin(tools.Env{Workspace: req.Workspace, TmpDir: tmp}), req.Agent.Tools.Allow, req.Agent.Tools.Deny)
	specs := set.Specs()

	conv := provider.Conversation{System: systemPrompt(req, log)}
	for _, t := range req.History {
		conv.Messages = append(conv.Messages, provider.Message{Role: provider.Role(t.Role), Text: t.Text})
	}
	conv.Messages = append(conv.Messages, provider.Message{Role: provider.RoleUser, Text: req.Message.Text})

	maxIter := req.Agent.MaxIterations
	if maxIter == 0 {
		maxIter = DefaultMaxIterations
	}
	for i := 1; i <= maxIter; i++ {
		if err := ctx.Err(); err != nil {
			return fail(agentproto.ExitAgentError, "The run was interrupted.", fmt.Errorf("interrupted: %w", err))
		}
		turn, usage, err := llm.Complete(ctx, conv, specs)
		resp.Usage.Iterations = i
		resp.Usage.InputTokens += usage.InputTokens
		resp.Usage.OutputTokens += usage.OutputTokens
		if err != nil {
			return fail(agentproto.ExitAgentError, "The model could not be reached.", err)
		}
		conv.Messages = append(conv.Messages, provider.Message{Role: provider.RoleAssistant, Text: turn.Text, ToolCalls: turn.ToolCalls})
		if len(turn.ToolCalls) == 0 {
			resp.Reply = turn.Text
			return resp, agentproto.ExitOK
		}
		for _, call := range turn.ToolCalls {
			out, err := set.Call(ctx, call.Name, call.Args)
			record := agentproto.ToolCall{Name: call.Name, Args: recordableArgs(call.Args), Output: out}
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

// recordableArgs keeps the model's arguments in the response; text that is
// not JSON is kept as a JSON string so the response stays valid.
func recordableArgs(args json.RawMessage) json.RawMessage {
	if len(args) == 0 || json.Valid(args) {
		return args
	}
	quoted, _ := json.Marshal(string(args))
	return quoted
}

// systemPrompt is SOUL.md (or a default) followed by MEMORY.md and USER.md
// when they exist. It creates nothing.
func systemPrompt(req agentproto.Request, log *slog.Logger) string {
	soul, ok := readPromptFile("SOUL.md", log)
	if !ok {
		name := req.Agent.Name
		if name == "" {
			name = req.Agent.ID
		}
		if name == "" {
			name = "berth agent"
		}
		soul = fmt.Sprintf("# %s\n\nYou are %s, an assistant that answers chat messages. "+
			"You work in a sandboxed workspace and can use the tools you are given.", name, name)
	}
	parts := []string{strings.TrimSpace(soul)}
	for _, name := range []string{"MEMORY.md", "USER.md"} {
		if text, ok := readPromptFile(name, log); ok {
			parts = append(parts, strings.TrimSpace(text))
		}
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

// chain tries the primary provider, then each fallback, on every call.
type chain struct {
	providers []provider.Provider
	names     []string
}

func newChain(primary agentproto.Provider, fallback []agentproto.Provider) (*chain, error) {
	c := &chain{}
	var errs []error
	for _, cfg := range append([]agentproto.Provider{primary}, fallback...) {
		p, err := provider.New(cfg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.providers = append(c.providers, p)
		c.names = append(c.names, cfg.Name)
	}
	if len(c.providers) == 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

func (c *chain) Complete(ctx context.Context, conv provider.Conversation, specs []provider.Tool) (provider.Turn, provider.Usage, error) {
	var errs []error
	for i, p := range c.providers {
		turn, usage, err := p.Complete(ctx, conv, specs)
		if err == nil {
			return turn, usage, nil
		}
		errs = append(errs, fmt.Errorf("provider %q: %w", c.names[i], err))
	}
	return provider.Turn{}, provider.Usage{}, errors.Join(errs...)
}
