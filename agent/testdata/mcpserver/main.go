// Command mcpserver is the MCP server the agent tests start over stdio,
// built with the official SDK; its first argument says how it behaves.
//
//	mcpserver serve [PIDFILE]  tools echo, read, parent, hidden, sleep, crash, fail (writes its pid to PIDFILE);
//	                           resources notes://readme, notes://logo (a blob), notes://slow (never answers),
//	                           notes://broken (fails); prompts summarise [topic], slow (never answers)
//	mcpserver tools            only the tools of serve: no resources, no prompts
//	mcpserver garbage          answers every line with text that is not JSON-RPC
//	mcpserver dupes            speaks JSON-RPC by hand and lists one tool twice
//	mcpserver junk             dupes that says it has resources and prompts, answers their lists with
//	                           garbage and a resource read not at all
//	mcpserver hang             reads stdin and never answers
//	mcpserver exit             says why on stderr and exits 3
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mcpserver serve|garbage|hang|exit")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		if len(os.Args) > 2 {
			if err := os.WriteFile(os.Args[2], []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		s := Server()
		AddResourcesAndPrompts(s)
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "tools":
		if err := Server().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "garbage":
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			fmt.Println("this is not JSON-RPC")
		}
	case "dupes":
		dupes(false)
	case "junk":
		dupes(true)
	case "hang":
		io.Copy(io.Discard, os.Stdin)
	case "exit":
		fmt.Fprintln(os.Stderr, "mcpserver: cannot open the issue database")
		os.Exit(3)
	}
}

type textArgs struct {
	Text string `json:"text"`
}

type pathArgs struct {
	Path string `json:"path"`
}

type noArgs struct{}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// Server is the test server's tools.
func Server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcpserver", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo the text."}, func(_ context.Context, _ *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		return text("echo: " + a.Text), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "read", Description: "Read a file."}, func(_ context.Context, _ *mcp.CallToolRequest, a pathArgs) (*mcp.CallToolResult, any, error) {
		data, err := os.ReadFile(a.Path)
		if err != nil {
			res := text(err.Error())
			res.IsError = true
			return res, nil, nil
		}
		return text(string(data)), nil, nil
	})
	// What a tool must not reach: berth-agent's own /proc entry.
	mcp.AddTool(s, &mcp.Tool{Name: "parent", Description: "Read the parent's /proc cmdline."}, func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", os.Getppid()))
		if err != nil {
			res := text(err.Error())
			res.IsError = true
			return res, nil, nil
		}
		return text(string(data)), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "hidden", Description: "A tool the entry leaves out."}, func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
		return text("hidden"), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "sleep", Description: "Never answers."}, func(ctx context.Context, _ *mcp.CallToolRequest, _ noArgs) (*mcp.CallToolResult, any, error) {
		<-ctx.Done()
		return nil, nil, ctx.Err()
	})
	mcp.AddTool(s, &mcp.Tool{Name: "crash", Description: "Exits mid-call."}, func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
		fmt.Fprintln(os.Stderr, "mcpserver: out of memory")
		os.Exit(5)
		return nil, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "Always fails."}, func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
		res := text("the tracker is down")
		res.IsError = true
		return res, nil, nil
	})
	return s
}

// ReadmeText is notes://readme's text.
const ReadmeText = "berth notes: the walls hold"

// AddResourcesAndPrompts gives s the test's resources and prompts.
func AddResourcesAndPrompts(s *mcp.Server) {
	s.AddResource(&mcp.Resource{URI: "notes://readme", Name: "readme", MIMEType: "text/plain", Description: "The notes."},
		func(_ context.Context, r *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: r.Params.URI, MIMEType: "text/plain", Text: ReadmeText}}}, nil
		})
	s.AddResource(&mcp.Resource{URI: "notes://logo", Name: "logo", MIMEType: "image/png"},
		func(_ context.Context, r *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: r.Params.URI, MIMEType: "image/png", Blob: []byte{0x89, 'P', 'N', 'G'}}}}, nil
		})
	s.AddResource(&mcp.Resource{URI: "notes://slow", Name: "slow"},
		func(ctx context.Context, _ *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
	s.AddResource(&mcp.Resource{URI: "notes://broken", Name: "broken"},
		func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return nil, fmt.Errorf("the notes store is down")
		})
	s.AddPrompt(&mcp.Prompt{Name: "summarise", Description: "Summarise a topic.", Arguments: []*mcp.PromptArgument{{Name: "topic", Required: true}}},
		func(_ context.Context, r *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Description: "A summary", Messages: []*mcp.PromptMessage{
				{Role: "user", Content: &mcp.TextContent{Text: "Summarise " + r.Params.Arguments["topic"] + " in one line."}},
			}}, nil
		})
	s.AddPrompt(&mcp.Prompt{Name: "slow", Description: "Never answers."},
		func(ctx context.Context, _ *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
}

// dupes answers initialize and tools/list by hand, with a tool listed
// twice, as a broken server might; with junk it also says it has
// resources and prompts, which it answers with garbage or not at all.
func dupes(junk bool) {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(in.Bytes(), &req) != nil || req.ID == nil {
			continue
		}
		var answer string
		switch req.Method {
		case "initialize":
			answer = `"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"dupes","version":"1"}}`
			if junk {
				answer = `"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{},"resources":{},"prompts":{}},"serverInfo":{"name":"junk","version":"1"}}`
			}
		case "tools/list":
			answer = `"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}},{"name":"echo","inputSchema":{"type":"object"}}]}`
		case "resources/list", "prompts/list", "resources/read":
			if !junk {
				answer = `"error":{"code":-32601,"message":"method not found"}`
				break
			}
			switch req.Method {
			case "resources/list":
				answer = `"result":{"resources":7}`
			case "prompts/list":
				answer = `"result":{"prompts":"none"}`
			default:
				continue // a read is never answered
			}
		default:
			answer = `"error":{"code":-32601,"message":"method not found"}`
		}
		fmt.Printf("{\"jsonrpc\":\"2.0\",\"id\":%s,%s}\n", req.ID, answer)
	}
}
