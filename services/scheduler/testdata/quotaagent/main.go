// Command quotaagent stands in for berth-agent in the workspace quota
// tests: like a shell tool, it writes into its workspace and reports what
// the filesystem said.
//
//	put FILE TEXT   writes TEXT to FILE
//	get FILE        replies with FILE's content
//	fill FILE MIB   writes up to MIB MiB to FILE; replies "wrote N MiB: ERROR"
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/agentproto"
)

func main() {
	var req agentproto.Request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fmt.Fprintln(os.Stderr, "bad request:", err)
		os.Exit(agentproto.ExitBadRequest)
	}
	args := strings.SplitN(req.Message.Text, " ", 3)
	resp := agentproto.Response{Version: agentproto.Version, RunID: req.RunID}
	path := func() string { return filepath.Join(req.Workspace, args[1]) }
	switch {
	case args[0] == "put" && len(args) == 3:
		if err := os.WriteFile(path(), []byte(args[2]), 0o600); err != nil {
			resp.Reply = "error: " + err.Error()
		} else {
			resp.Reply = "ok"
		}
	case args[0] == "get" && len(args) == 2:
		b, err := os.ReadFile(path())
		if err != nil {
			resp.Reply = "error: " + err.Error()
		} else {
			resp.Reply = string(b)
		}
	case args[0] == "fill" && len(args) == 3:
		n, _ := strconv.Atoi(args[2])
		resp.Reply = fill(path(), n)
	default:
		resp.Reply = "unknown command"
	}
	if err := json.NewEncoder(os.Stdout).Encode(resp); err != nil {
		os.Exit(agentproto.ExitInternal)
	}
}

func fill(path string, mib int) string {
	f, err := os.Create(path)
	if err != nil {
		return "wrote 0 MiB: " + err.Error()
	}
	chunk := make([]byte, 1<<20)
	var written int
	for i := 0; i < mib; i++ {
		n, err := f.Write(chunk)
		written += n
		if err != nil {
			f.Close()
			return fmt.Sprintf("wrote %d MiB: %v", written>>20, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Sprintf("wrote %d MiB: %v", written>>20, err)
	}
	return fmt.Sprintf("wrote %d MiB: ok", written>>20)
}
