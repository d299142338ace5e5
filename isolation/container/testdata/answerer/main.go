// Command answerer stands in for berth-agent in tests of how a container
// run ends: it reads the request and, by the message's text, answers and
// then hangs ("hang"), or writes a line that is no response and exits 0
// ("garbage"), each after berth-agent's last log line.
package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

func main() {
	var req agentproto.Request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fmt.Fprintln(os.Stderr, "bad request:", err)
		os.Exit(agentproto.ExitBadRequest)
	}
	switch req.Message.Text {
	case "hang":
		// As berth-agent does: its last log line, then the response.
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Info(isolation.ResponseFollows, "run_id", req.RunID)
		json.NewEncoder(os.Stdout).Encode(agentproto.Response{Version: agentproto.Version, RunID: req.RunID, Reply: "answered, now hanging"})
		for {
			time.Sleep(time.Hour)
		}
	case "garbage":
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Info(isolation.ResponseFollows, "run_id", req.RunID)
		fmt.Println("this is no response")
	default:
		fmt.Fprintln(os.Stderr, "unknown text", req.Message.Text)
		os.Exit(agentproto.ExitInternal)
	}
}
