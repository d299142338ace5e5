// Command berth-agent runs one agent request inside a sandbox: a JSON request
// on stdin, a JSON response on stdout. See package agent for the details.
// Run with confine.ToolLauncherArg first, it is the launcher berth-agent
// starts its tool processes through (see confine.Launcher).
package main

import (
	"os"

	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/agent/podfiles"
	"github.com/berth-dev/berth/internal/agentproto"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == confine.ToolLauncherArg {
		os.Exit(confine.LaunchTool(os.Args[2:], os.Stderr))
	}
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case agentproto.FilesWaitArg:
			os.Exit(podfiles.Wait())
		case agentproto.FilesInArg:
			os.Exit(podfiles.In(os.Args[2:], os.Stdin, os.Stderr))
		case agentproto.FilesOutArg:
			os.Exit(podfiles.Out(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
		}
	}
	if len(os.Args) > 1 && os.Args[1] == agent.ServeArg {
		os.Exit(agent.Serve(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(agent.Main(os.Stdin, os.Stdout, os.Stderr))
}
