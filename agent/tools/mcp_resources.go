package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berth-dev/berth/agent/provider"
)

// An MCP server's resources and prompts reach the model as three tools of
// the server, offered only when the server advertises the capability and,
// like its own tools, only those the entry's tools list names when it has
// one: mcp__<name>__list_resources, mcp__<name>__read_resource and
// mcp__<name>__get_prompt (whose description lists the server's prompts).
const (
	mcpListResources = "list_resources"
	mcpReadResource  = "read_resource"
	mcpGetPrompt     = "get_prompt"
	// mcpMaxPrompts is how many prompts get_prompt's description names.
	mcpMaxPrompts = 64
)

// resourceTools are the resource and prompt tools s offers, after its own
// tools (a tool of the server's with one of these names wins).
func (s *mcpServer) resourceTools(ctx context.Context, own []Tool, log *slog.Logger) []Tool {
	init := s.session.InitializeResult()
	if init == nil || init.Capabilities == nil {
		return nil
	}
	caps := init.Capabilities
	var out []Tool
	add := func(name string, spec provider.Tool, call func(context.Context, json.RawMessage) (string, error)) {
		if len(s.entry.Tools) > 0 && !slices.Contains(s.entry.Tools, name) {
			return
		}
		spec.Name = mcpFullName(s.entry.Name, name)
		if !mcpToolName.MatchString(spec.Name) {
			return
		}
		if slices.ContainsFunc(own, func(t Tool) bool { return t.Spec().Name == spec.Name }) {
			log.Warn("MCP server has a tool of the name berth gives its "+strings.ReplaceAll(name, "_", " ")+": the server's tool is offered", "server", s.entry.Name, "tool", name)
			return
		}
		out = append(out, mcpCallTool{server: s, name: name, spec: spec, call: call})
	}
	if caps.Resources != nil {
		add(mcpListResources, provider.Tool{
			Description: fmt.Sprintf("List the resources of MCP server %s: each resource's URI, name, type and description. Pass the cursor it gives to see more.", s.entry.Name),
			Parameters:  schema(`{"type":"object","properties":{"cursor":{"type":"string","description":"The cursor a previous call gave, for the next page."}}}`),
		}, s.listResources)
		add(mcpReadResource, provider.Tool{
			Description: fmt.Sprintf("Read one resource of MCP server %s by its URI (from %s).", s.entry.Name, mcpFullName(s.entry.Name, mcpListResources)),
			Parameters:  schema(`{"type":"object","properties":{"uri":{"type":"string","description":"The resource's URI."}},"required":["uri"]}`),
		}, s.readResource)
	}
	if caps.Prompts != nil {
		add(mcpGetPrompt, provider.Tool{
			Description: s.promptsDescription(ctx, log),
			Parameters:  schema(`{"type":"object","properties":{"name":{"type":"string","description":"The prompt's name."},"arguments":{"type":"object","additionalProperties":{"type":"string"},"description":"The prompt's arguments, by name."}},"required":["name"]}`),
		}, s.getPrompt)
	}
	return out
}

// promptsDescription is get_prompt's description: the server's prompts
// with their arguments, or why they could not be listed.
func (s *mcpServer) promptsDescription(ctx context.Context, log *slog.Logger) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Get a prompt of MCP server %s: its messages, with the arguments filled in.", s.entry.Name)
	n := 0
	for p, err := range s.session.Prompts(ctx, nil) {
		if err != nil {
			log.Warn("MCP server did not list its prompts", "server", s.entry.Name, "err", err.Error())
			fmt.Fprintf(&b, " Its prompts could not be listed (%s).", CleanText(s.failure(ctx, "did not list its prompts", err).Error()))
			break
		}
		if n == mcpMaxPrompts {
			b.WriteString("\n- (more not shown)")
			break
		}
		n++
		if n == 1 {
			b.WriteString(" Its prompts:")
		}
		line := "\n- " + p.Name
		var args []string
		for _, a := range p.Arguments {
			if a == nil {
				continue
			}
			arg := a.Name
			if a.Required {
				arg += " (required)"
			}
			args = append(args, arg)
		}
		if len(args) > 0 {
			line += " [" + strings.Join(args, ", ") + "]"
		}
		if d := p.Description; d != "" {
			line += ": " + d
		}
		b.WriteString(CleanText(truncate(line, 256)))
	}
	return truncate(b.String(), mcpDescription)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// mcpCallTool is one of the resource and prompt tools of a server.
type mcpCallTool struct {
	server *mcpServer
	name   string
	spec   provider.Tool
	call   func(context.Context, json.RawMessage) (string, error)
}

func (t mcpCallTool) Spec() provider.Tool { return t.spec }

func (t mcpCallTool) Call(ctx context.Context, raw json.RawMessage) (string, error) {
	s := t.server
	if s.err != nil {
		return "", fmt.Errorf("this tool is unavailable: %w", s.err)
	}
	if len(raw) == 0 {
		raw = json.RawMessage("{}")
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	out, err := t.call(ctx, raw)
	if err != nil {
		var bad badArgs
		if errors.As(err, &bad) {
			return "", err
		}
		return "", s.failure(ctx, "failed on "+t.name, err)
	}
	return CleanText(out), nil
}

type badArgs struct{ error }

// mcpArgs decodes a resource or prompt tool's arguments strictly.
func mcpArgs(raw json.RawMessage, into any) error {
	if err := decodeArgs(raw, into); err != nil {
		return badArgs{err}
	}
	return nil
}

func (s *mcpServer) listResources(ctx context.Context, raw json.RawMessage) (string, error) {
	var in struct {
		Cursor string `json:"cursor"`
	}
	if err := mcpArgs(raw, &in); err != nil {
		return "", err
	}
	res, err := s.session.ListResources(ctx, &mcp.ListResourcesParams{Cursor: in.Cursor})
	if err != nil {
		return "", err
	}
	out := &capped{limit: MCPOutputLimit}
	if len(res.Resources) == 0 {
		io.WriteString(out, "no resources")
	}
	for i, r := range res.Resources {
		if r == nil {
			continue
		}
		if i > 0 {
			io.WriteString(out, "\n")
		}
		line := r.URI
		if r.Name != "" {
			line += " " + r.Name
		}
		if r.MIMEType != "" {
			line += " (" + r.MIMEType + ")"
		}
		if r.Description != "" {
			line += ": " + r.Description
		}
		io.WriteString(out, truncate(line, 1024))
	}
	if res.NextCursor != "" {
		fmt.Fprintf(out, "\nmore: call again with cursor %q", res.NextCursor)
	}
	return out.String(), nil
}

func (s *mcpServer) readResource(ctx context.Context, raw json.RawMessage) (string, error) {
	var in struct {
		URI string `json:"uri"`
	}
	if err := mcpArgs(raw, &in); err != nil {
		return "", err
	}
	if in.URI == "" {
		return "", badArgs{errors.New("bad arguments: uri is required")}
	}
	res, err := s.session.ReadResource(ctx, &mcp.ReadResourceParams{URI: in.URI})
	if err != nil {
		return "", err
	}
	out := &capped{limit: MCPOutputLimit}
	for i, c := range res.Contents {
		if c == nil {
			continue
		}
		if i > 0 {
			io.WriteString(out, "\n")
		}
		if c.Text != "" || len(c.Blob) == 0 {
			io.WriteString(out, c.Text)
		} else {
			fmt.Fprintf(out, "[resource %s, %s, %d bytes, not shown]", c.URI, c.MIMEType, len(c.Blob))
		}
	}
	return out.String(), nil
}

func (s *mcpServer) getPrompt(ctx context.Context, raw json.RawMessage) (string, error) {
	var in struct {
		Name      string            `json:"name"`
		Arguments map[string]string `json:"arguments"`
	}
	if err := mcpArgs(raw, &in); err != nil {
		return "", err
	}
	if in.Name == "" {
		return "", badArgs{errors.New("bad arguments: name is required")}
	}
	res, err := s.session.GetPrompt(ctx, &mcp.GetPromptParams{Name: in.Name, Arguments: in.Arguments})
	if err != nil {
		return "", err
	}
	out := &capped{limit: MCPOutputLimit}
	if res.Description != "" {
		io.WriteString(out, res.Description+"\n")
	}
	for i, m := range res.Messages {
		if m == nil {
			continue
		}
		if i > 0 {
			io.WriteString(out, "\n")
		}
		fmt.Fprintf(out, "%s: %s", m.Role, contentText(m.Content))
	}
	return out.String(), nil
}
