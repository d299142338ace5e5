package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
)

// Serve mode keeps one confined berth-agent for a sandbox that outlives a
// message (docs/adr/0021-conversation-sandboxes.md). berth-agent runs with
// ServeArg as its first argument; stdin and stdout then carry one JSON
// object per line:
//
//   - the first request opens the sandbox: the agent confines itself as
//     it says (rlimits, masks, egress proxy, Landlock, syscall filter) and
//     answers a Response with its run id and nothing else, the sign that
//     it is ready; it runs no conversation;
//   - every later line is one request, run to its end and answered by one
//     Response line, one at a time. A request whose confinement (policy,
//     workspace, egress, rlimits) is not the opening one's is answered with
//     an error and not run: a sandbox never widens after it was opened;
//   - EOF on stdin ends serving (exit 0); so does SIGTERM or SIGINT, which
//     first cancels the request under way (its response is still written).
//
// With ServePIDNamespaceArg after ServeArg the agent knows it lives in a
// PID namespace of its own under an init (a container with Init): at
// SIGTERM it passes SIGTERM on to every process of the namespace and exits
// only once they are gone, so the backend's grace covers the tools too.

// ServeArg, as berth-agent's first argument, selects serve mode.
const ServeArg = agentproto.ServeArg

// ServePIDNamespaceArg, after ServeArg, says the agent is in a PID
// namespace of its own (a container), where kill(-1) reaches only it.
const ServePIDNamespaceArg = agentproto.ServePIDNamespaceArg

// Serve runs serve mode with the given standard streams and returns the
// exit code; args are the arguments after ServeArg.
func Serve(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	log := newLogger(stderr)
	ownPIDNamespace := false
	for _, a := range args {
		if a != ServePIDNamespaceArg {
			log.Error("bad request", "reason", fmt.Sprintf("unknown serve argument %q", a))
			return agentproto.ExitBadRequest
		}
		ownPIDNamespace = true
	}
	if err := confine.NonDumpable(); err != nil {
		log.Error("refusing to run", "reason", err.Error())
		return agentproto.ExitConfinement
	}
	lines := bufio.NewReaderSize(stdin, 64<<10)
	first, err := readLine(lines)
	if err != nil {
		log.Error("bad request", "reason", err.Error())
		return agentproto.ExitBadRequest
	}
	open, err := decodeRequest(first)
	if err != nil {
		log.Error("bad request", "reason", err.Error())
		return agentproto.ExitBadRequest
	}
	log = log.With("sandbox", open.RunID, "agent", open.Agent.ID)
	oom := watchOOM(log)
	launcher, release, ok := confineFor(open, log)
	if !ok {
		return agentproto.ExitConfinement
	}
	defer release()

	out := json.NewEncoder(stdout)
	if err := out.Encode(agentproto.Response{Version: agentproto.Version, RunID: open.RunID}); err != nil {
		log.Error("cannot write response", "err", err.Error())
		return agentproto.ExitInternal
	}
	log.Info("sandbox ready")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	requests := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		for {
			line, err := readLine(lines)
			if err != nil {
				readErr <- err
				return
			}
			select {
			case requests <- line:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			log.Info("sandbox stopping", "reason", "signal")
			if ownPIDNamespace {
				endNamespace(launcher, log)
			}
			return agentproto.ExitOK
		case err := <-readErr:
			if errors.Is(err, io.EOF) {
				log.Info("sandbox stopping", "reason", "end of requests")
				return agentproto.ExitOK
			}
			log.Error("bad request", "reason", err.Error())
			return agentproto.ExitBadRequest
		case line := <-requests:
			before := oom.now()
			resp := serveOne(ctx, open, line, launcher, log)
			resp.OOMKills = oom.since(before)
			// The last log line of the request, as in a one-shot run.
			log.Info(agentproto.LogResponseFollows, "run_id", resp.RunID)
			if err := out.Encode(deliverable(resp)); err != nil {
				log.Error("cannot write response", "err", err.Error())
				return agentproto.ExitInternal
			}
		}
	}
}

// serveOne runs one request of a served sandbox.
func serveOne(ctx context.Context, open agentproto.Request, line []byte, launcher *confine.Launcher, log *slog.Logger) agentproto.Response {
	req, err := decodeRequest(line)
	if err == nil {
		err = sameConfinement(open, req)
	}
	if err != nil {
		log.Error("bad request", "run_id", req.RunID, "reason", err.Error())
		return agentproto.Response{Version: agentproto.Version, RunID: req.RunID,
			Reply: "The agent could not take the request.", Error: "bad request: " + err.Error()}
	}
	resp, _ := runSafely(ctx, req, launcher, log.With("run_id", req.RunID))
	return resp
}

// sameConfinement refuses a request that would run under other rules than
// those the sandbox confined itself with: they are fixed at its opening.
func sameConfinement(open, req agentproto.Request) error {
	switch {
	case !reflect.DeepEqual(open.Policy, req.Policy):
		return errors.New("its policy is not the sandbox's")
	case open.Workspace != req.Workspace:
		return fmt.Errorf("its workspace %q is not the sandbox's %q", req.Workspace, open.Workspace)
	case !reflect.DeepEqual(open.Egress, req.Egress):
		return errors.New("its egress is not the sandbox's")
	case !reflect.DeepEqual(open.Rlimits, req.Rlimits):
		return errors.New("its rlimits are not the sandbox's")
	}
	return nil
}

// readLine reads one line of at most MaxRequestSize bytes, without its
// newline; a last line without one counts.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxRequestSize+1 {
			return nil, fmt.Errorf("request is larger than %d bytes", MaxRequestSize)
		}
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(bytes.TrimSpace(line)) > 0:
			return line, nil
		default:
			return nil, err
		}
	}
}

// endNamespace passes SIGTERM on to every other process of the agent's own
// PID namespace and waits for them to end; the backend kills what is left
// after its grace. kill(-1) spares the caller and the namespace's init, and
// kill(-1, 0) says whether any of them is left without reading /proc
// (which Landlock keeps from the agent); init reaps them as they end. The
// signals leave from the launcher's thread, the one whose Landlock domain
// the tools' lies beneath (confine.Launcher).
func endNamespace(launcher *confine.Launcher, log *slog.Logger) {
	kill := syscall.Kill
	if launcher != nil {
		kill = launcher.Kill
	}
	if err := kill(-1, syscall.SIGTERM); err != nil {
		if !errors.Is(err, syscall.ESRCH) {
			log.Warn("cannot pass SIGTERM on to the sandbox's processes", "err", err.Error())
		}
		return
	}
	log.Info("waiting for the sandbox's processes to end")
	for kill(-1, 0) == nil {
		time.Sleep(20 * time.Millisecond)
	}
}
