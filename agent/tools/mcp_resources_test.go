package tools

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berth-dev/berth/internal/agentproto"
)

func TestAServersResourcesAndPromptsAreToolsOnlyWhenItHasThemAndTheEntryAllowsThem(t *testing.T) {
	t.Parallel()
	bin := testServerBinary(t)
	env := workspace(t)
	m := connect(t, env,
		agentproto.MCPServer{Name: "notes", Command: []string{bin, "serve"}},
		agentproto.MCPServer{Name: "plain", Command: []string{bin, "tools"}},
		agentproto.MCPServer{Name: "picky", Command: []string{bin, "serve"}, Tools: []string{"echo", "read_resource"}},
	)
	names := toolNames(m.Tools())
	for _, want := range []string{"mcp__notes__list_resources", "mcp__notes__read_resource", "mcp__notes__get_prompt", "mcp__picky__read_resource", "mcp__picky__echo"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools lack %s: %v", want, names)
		}
	}
	for _, unwanted := range []string{"mcp__plain__list_resources", "mcp__plain__read_resource", "mcp__plain__get_prompt", "mcp__picky__list_resources", "mcp__picky__get_prompt"} {
		if slices.Contains(names, unwanted) {
			t.Errorf("tools offer %s: a server without the capability, or an entry whose tools leave it out: %v", unwanted, names)
		}
	}
	if st := m.Status(); !slices.Contains(st[0].Tools, "mcp__notes__read_resource") || !slices.Contains(st[2].Tools, "mcp__picky__read_resource") {
		t.Errorf("the record's lines do not name the resource tools: %+v", st)
	}
	var prompt string
	for _, tool := range m.Tools() {
		if tool.Spec().Name == "mcp__notes__get_prompt" {
			prompt = tool.Spec().Description
		}
	}
	if !strings.Contains(prompt, "- summarise [topic (required)]: Summarise a topic.") || !strings.Contains(prompt, "- slow") {
		t.Errorf("get_prompt's description does not list the server's prompts: %q", prompt)
	}

	set := Filter(m.Tools(), nil, []string{"mcp__notes__get_prompt"})
	call := func(name, args string) (string, error) {
		return set.Call(context.Background(), name, json.RawMessage(args))
	}
	if out, err := call("mcp__notes__list_resources", `{}`); err != nil || !strings.Contains(out, "notes://readme readme (text/plain): The notes.") || !strings.Contains(out, "notes://logo logo (image/png)") {
		t.Errorf("list_resources = %q, %v", out, err)
	}
	if out, err := call("mcp__notes__read_resource", `{"uri":"notes://readme"}`); err != nil || out != "berth notes: the walls hold" {
		t.Errorf("read_resource readme = %q, %v", out, err)
	}
	if out, err := call("mcp__notes__read_resource", `{"uri":"notes://logo"}`); err != nil || out != "[resource notes://logo, image/png, 4 bytes, not shown]" {
		t.Errorf("read_resource logo = %q, %v", out, err)
	}
	if _, err := call("mcp__notes__read_resource", `{"uri":"notes://broken"}`); err == nil || !strings.Contains(err.Error(), "MCP server notes failed on read_resource") || !strings.Contains(err.Error(), "the notes store is down") {
		t.Errorf("a resource that fails gave %v", err)
	}
	if _, err := call("mcp__notes__read_resource", `{"uri":"notes://none"}`); err == nil || !strings.Contains(err.Error(), "MCP server notes failed on read_resource") {
		t.Errorf("an unknown resource gave %v", err)
	}
	if _, err := call("mcp__notes__read_resource", `{}`); err == nil || !strings.Contains(err.Error(), "uri is required") {
		t.Errorf("a read without uri gave %v", err)
	}
	if _, err := call("mcp__notes__get_prompt", `{"name":"summarise"}`); err == nil {
		t.Error("a tool the agent's deny names was called")
	}
	all := Filter(m.Tools(), nil, nil)
	if out, err := all.Call(context.Background(), "mcp__notes__get_prompt", json.RawMessage(`{"name":"summarise","arguments":{"topic":"walls"}}`)); err != nil || out != "A summary\nuser: Summarise walls in one line." {
		t.Errorf("get_prompt = %q, %v", out, err)
	}
	if _, err := all.Call(context.Background(), "mcp__notes__get_prompt", json.RawMessage(`{"name":7}`)); err == nil || !strings.Contains(err.Error(), "bad arguments") {
		t.Errorf("get_prompt with a name that is no string gave %v", err)
	}
}

// A read or a prompt that hangs is a tool error after the server's
// timeout, and the server answers the next call; a server that lists its
// resources and prompts as garbage gives tool errors that say so.
func TestResourcesAndPromptsThatHangOrAreGarbageGiveToolErrors(t *testing.T) {
	t.Parallel()
	bin := testServerBinary(t)
	m := connect(t, workspace(t),
		agentproto.MCPServer{Name: "slow", Command: []string{bin, "serve"}, TimeoutSeconds: 1},
		agentproto.MCPServer{Name: "junk", Command: []string{bin, "junk"}, TimeoutSeconds: 1},
	)
	set := Filter(m.Tools(), nil, nil)
	call := func(name, args string) (string, error) {
		return set.Call(context.Background(), name, json.RawMessage(args))
	}
	if _, err := call("mcp__slow__read_resource", `{"uri":"notes://slow"}`); err == nil || !strings.Contains(err.Error(), "MCP server slow failed on read_resource: no answer within 1s") {
		t.Errorf("a read that hangs gave %v", err)
	}
	if _, err := call("mcp__slow__get_prompt", `{"name":"slow"}`); err == nil || !strings.Contains(err.Error(), "MCP server slow failed on get_prompt: no answer within 1s") {
		t.Errorf("a prompt that hangs gave %v", err)
	}
	if out, err := call("mcp__slow__read_resource", `{"uri":"notes://readme"}`); err != nil || out != "berth notes: the walls hold" {
		t.Errorf("after the hung calls: %q, %v", out, err)
	}

	if st := m.Status(); st[1].Error != "" || !slices.Contains(st[1].Tools, "mcp__junk__list_resources") {
		t.Fatalf("junk's line = %+v, want its tools with list_resources", st[1])
	}
	if _, err := call("mcp__junk__list_resources", `{}`); err == nil || !strings.Contains(err.Error(), "MCP server junk failed on list_resources") {
		t.Errorf("a resource list that is garbage gave %v", err)
	}
	if _, err := call("mcp__junk__read_resource", `{"uri":"x://y"}`); err == nil || !strings.Contains(err.Error(), "MCP server junk failed on read_resource: no answer within 1s") {
		t.Errorf("a read the server never answers gave %v", err)
	}
	for _, tool := range m.Tools() {
		if tool.Spec().Name == "mcp__junk__get_prompt" && !strings.Contains(tool.Spec().Description, "could not be listed") {
			t.Errorf("get_prompt of a server whose prompt list is garbage says %q", tool.Spec().Description)
		}
	}
}

func TestAStreamableHTTPServersResourcesAreRead(t *testing.T) {
	t.Parallel()
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server {
		s := testServer()
		s.AddResource(&mcp.Resource{URI: "tracker://open", Name: "open"}, func(_ context.Context, r *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: r.Params.URI, Text: "7 open issues"}}}, nil
		})
		return s
	}, nil)
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	env := behindEgress(t, workspace(t), srv.Listener.Addr().String())
	m := connect(t, env, agentproto.MCPServer{Name: "tracker", URL: srv.URL + "/mcp"})
	if names := toolNames(m.Tools()); !slices.Equal(names, []string{"mcp__tracker__echo", "mcp__tracker__list_resources", "mcp__tracker__read_resource"}) {
		t.Fatalf("tools = %v, want echo and the resource tools (no prompts: the server has none)", names)
	}
	if out, err := Filter(m.Tools(), nil, nil).Call(context.Background(), "mcp__tracker__read_resource", json.RawMessage(`{"uri":"tracker://open"}`)); err != nil || out != "7 open issues" {
		t.Errorf("read_resource = %q, %v", out, err)
	}
}
