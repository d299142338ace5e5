// Command testagent stands in for berth-agent in the host runner's tests. It
// reads one request on stdin and does what the message text says.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/hostsandbox"
)

// Report is what "whoami" puts in the reply.
type Report struct {
	UID          int      `json:"uid"`
	GID          int      `json:"gid"`
	Groups       []int    `json:"groups"`
	Env          []string `json:"env"`
	Args         []string `json:"args"`
	Cwd          string   `json:"cwd"`
	Workspace    string   `json:"workspace"`
	Unrestricted bool     `json:"unrestricted"`
	Interfaces   []string `json:"interfaces"`
	// NetNS names the process's network namespace (net:[inode]).
	NetNS string `json:"netns"`
}

func main() {
	var req agentproto.Request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fmt.Fprintln(os.Stderr, "bad request:", err)
		os.Exit(agentproto.ExitBadRequest)
	}
	// As berth-agent does, first thing with the request.
	if err := hostsandbox.ApplyRlimits(req.Rlimits); err != nil {
		fmt.Fprintln(os.Stderr, "confinement failed:", err)
		os.Exit(agentproto.ExitConfinement)
	}
	cmd, arg, _ := strings.Cut(req.Message.Text, " ")
	resp := agentproto.Response{Version: agentproto.Version, RunID: req.RunID}
	code := agentproto.ExitOK
	switch cmd {
	case "echo":
		resp.Reply = arg
	case "whoami":
		groups, _ := os.Getgroups()
		cwd, _ := os.Getwd()
		r := Report{
			UID: os.Getuid(), GID: os.Getgid(), Groups: groups,
			Env: os.Environ(), Args: os.Args, Cwd: cwd,
			Workspace: req.Workspace, Unrestricted: req.Policy.Unrestricted,
			Interfaces: interfaces(), NetNS: netNamespace(),
		}
		b, _ := json.Marshal(r)
		resp.Reply = string(b)
	case "limits":
		b, _ := os.ReadFile("/proc/self/limits")
		resp.Reply = string(b)
	case "sleep":
		time.Sleep(time.Hour)
	case "spawn":
		child := exec.Command("/bin/sleep", "3600")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "cannot spawn:", err)
			os.Exit(agentproto.ExitInternal)
		}
		pidFile := filepath.Join(req.Workspace, "child.pid")
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(child.Process.Pid)), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "cannot write pid:", err)
		}
		time.Sleep(time.Hour)
	case "untilusr1":
		// Answers once sent SIGUSR1; <workspace>/ready says it listens.
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		if err := os.WriteFile(filepath.Join(req.Workspace, "ready"), nil, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "cannot write ready:", err)
			os.Exit(agentproto.ExitInternal)
		}
		<-usr1
		resp.Reply = "released"
	case "confinement":
		fmt.Fprintln(os.Stderr, "cannot enforce policy: landlock ABI too old")
		os.Exit(agentproto.ExitConfinement)
	case "crash":
		// Lots of stderr first: only the tail may be kept.
		for i := 0; i < 5000; i++ {
			fmt.Fprintf(os.Stderr, "log line %05d padding padding padding\n", i)
		}
		fmt.Fprintln(os.Stderr, "panic: something broke")
		n, _ := strconv.Atoi(arg)
		os.Exit(n)
	case "garbage":
		fmt.Println("this is not json")
		os.Exit(agentproto.ExitOK)
	case "wrongrun":
		resp.RunID = "someone-else"
	case "agenterror":
		resp.Error = "max iterations reached"
		code = agentproto.ExitAgentError
	}
	if err := json.NewEncoder(os.Stdout).Encode(resp); err != nil {
		os.Exit(agentproto.ExitInternal)
	}
	os.Exit(code)
}

// netNamespace names the process's network namespace, the way the kernel
// does (net:[inode]); two processes share a namespace when the names match.
func netNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return "error: " + err.Error()
	}
	return ns
}

// interfaces lists the network interfaces of the process's own namespace.
func interfaces() []string {
	data, err := os.ReadFile("/proc/self/net/dev")
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var names []string
	for _, line := range strings.Split(string(data), "\n") {
		name, _, ok := strings.Cut(line, ":")
		if ok {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
}
