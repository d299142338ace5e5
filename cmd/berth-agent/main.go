// Command berth-agent runs one agent request inside a sandbox: a JSON request
// on stdin, a JSON response on stdout. See package agent for the details.
package main

import (
	"os"

	"github.com/berth-dev/berth/agent"
)

func main() {
	os.Exit(agent.Main(os.Stdin, os.Stdout, os.Stderr))
}
