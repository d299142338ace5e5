// Command mcpserver is the MCP server the agent tests start over stdio,
// built with the official SDK; its first argument says how it behaves.
//
//	mcpserver serve [PIDFILE]  tools echo, read, parent, hidden, sleep, crash, fail (writes its pid to PIDFILE)
//	mcpserver garbage          answers every line with text that is not JSON-RPC
//	mcpserver dupes            speaks JSON-RPC by hand and lists one tool twice
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
		dupes()
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

// dupes answers initialize and tools/list by hand, with a tool listed
// twice, as a broken server might.
func dupes() {
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
		case "tools/list":
			answer = `"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}},{"name":"echo","inputSchema":{"type":"object"}}]}`
		default:
			answer = `"error":{"code":-32601,"message":"method not found"}`
		}
		fmt.Printf("{\"jsonrpc\":\"2.0\",\"id\":%s,%s}\n", req.ID, answer)
	}
}
