package kube

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// A run's files in a pod (ADR 29). A one-shot or warm pod has a second container,
// "files": berth-agent in files-wait mode, the agent's hardening and uid,
// the workspace mounted and nothing else. It lives as long as the pod, so
// the workspace is reachable before the agent has its request and after
// it answered (its container may have ended by then). Over pods/exec:
//
//   - in: before the request is attached, a tar berth writes from the
//     staged copies (names berth's, regular files only) streams to
//     `berth-agent files-in`, which places it read-only under
//     inbox/<message id>/; a failure fails the run before the agent ran;
//   - out: after the response and before the pod is deleted (a one-shot
//     pod's deletion waits for it), `berth-agent files-out` answers the
//     reply's paths with a tar read by workspacefile's rules; berth reads
//     it bounded by the caps, entry by entry, and trusts none of it.
//
// Each exec has a deadline: the API deadline plus a second per MiB moved.

const (
	filesContainer = "files"
	// minFilesRate is the slowest a pod's files may move before the
	// exec's deadline ends it.
	minFilesRate = 1 << 20 // bytes a second
	// maxExecStderr is how much of a helper's stderr an error quotes.
	maxExecStderr = 2 << 10
)

// filesResources are the files container's requests and limits: it copies
// through small buffers.
var filesResources = corev1.ResourceList{
	corev1.ResourceMemory: resource.MustParse("64Mi"),
	corev1.ResourceCPU:    resource.MustParse("100m"),
}

// withFilesContainer adds the files container to a run's pod: the agent
// container's image, user and hardening, the workspace only.
func withFilesContainer(pod *corev1.Pod) {
	agent := pod.Spec.Containers[0]
	c := corev1.Container{
		Name: filesContainer, Image: agent.Image, ImagePullPolicy: agent.ImagePullPolicy,
		Args:       []string{agentproto.FilesWaitArg},
		WorkingDir: agent.WorkingDir, Env: agent.Env,
		Resources:                corev1.ResourceRequirements{Requests: filesResources, Limits: filesResources},
		SecurityContext:          agent.SecurityContext.DeepCopy(),
		VolumeMounts:             []corev1.VolumeMount{{Name: "workspace", MountPath: isolation.ContainerWorkspace}},
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	pod.Spec.Containers = append(pod.Spec.Containers, c)
}

// filesStarted is started, and the files container running too.
func filesStarted(pod *corev1.Pod, p isolation.Plan) (bool, error) {
	ok, err := started(pod, p)
	if !ok || err != nil {
		return ok, err
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != filesContainer {
			continue
		}
		if t := cs.State.Terminated; t != nil {
			return false, isolation.Errorf(isolation.ReasonStart, "the pod's files container ended at its start (exit %d, %s: %s)", t.ExitCode, t.Reason, t.Message)
		}
		return cs.State.Running != nil, nil
	}
	return len(pod.Spec.Containers) < 2, nil // a pod of an older berth has none
}

// filesDeadline bounds an exec that moves n bytes.
func (b *Backend) filesDeadline(n int64) time.Duration {
	return b.apiTimeout + time.Duration(n/minFilesRate+1)*time.Second
}

// filesContainerOf is the container of pod that files go through: its
// files container, else (a kept pod) the agent's.
func filesContainerOf(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == filesContainer {
			return filesContainer
		}
	}
	return agentContainer
}

// execFiles runs berth-agent with args in container of the pod.
func (b *Backend) execFiles(ctx context.Context, ns, name, container string, args []string, stdin io.Reader, stdout io.Writer) error {
	if container == "" {
		container = filesContainer
	}
	exec, err := b.streamer(ns, name, "exec", &corev1.PodExecOptions{Container: container, Command: append([]string{agentBinary}, args...),
		Stdin: stdin != nil, Stdout: stdout != nil, Stderr: true})
	if err != nil {
		return err
	}
	var stderr tailBuffer
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: &stderr})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("it did not end within its deadline: %w", context.Cause(ctx))
	}
	if err != nil && stderr.Len() > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return err
}

// agentBinary is berth-agent in berth's agent image (imagectl).
const agentBinary = "/usr/libexec/berth/berth-agent"

// tailBuffer keeps the first maxExecStderr bytes written to it.
type tailBuffer struct{ bytes.Buffer }

func (t *tailBuffer) Write(p []byte) (int, error) {
	if room := maxExecStderr - t.Len(); room > 0 {
		t.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// putFiles places files.In in the pod's workspace under files.InDir.
func (s *session) putFiles(ctx context.Context, files *isolation.RunFiles) error {
	if files == nil || len(files.In) == 0 {
		return nil
	}
	var total int64
	for _, f := range files.In {
		total += f.Size
	}
	ctx, cancel := context.WithTimeout(ctx, s.b.filesDeadline(total))
	defer cancel()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeInbox(pw, files.In)) }()
	err := s.b.execFiles(ctx, s.ns, s.name, s.filesIn, []string{agentproto.FilesInArg, isolation.ContainerWorkspace, files.InDir}, pr, nil)
	pr.CloseWithError(errors.New("the exec ended"))
	if err != nil {
		return &isolation.RunError{Reason: isolation.ReasonStart,
			Detail: fmt.Sprintf("cannot place the message's files (%s) in pod %s/%s's workspace under %s", isolation.FormatBytes(total), s.ns, s.name, files.InDir), Err: err}
	}
	return nil
}

// writeInbox writes the staged files as a tar of regular files, each
// exactly its announced size.
func writeInbox(w io.Writer, in []isolation.InFile) error {
	tw := tar.NewWriter(w)
	for _, f := range in {
		if f.Name == "" || f.Name != path.Base(f.Name) || f.Name == "." || f.Name == ".." {
			return fmt.Errorf("file name %q is not one path element", f.Name)
		}
		src, err := os.Open(f.Path)
		if err != nil {
			return err
		}
		err = tw.WriteHeader(&tar.Header{Name: f.Name, Typeflag: tar.TypeReg, Mode: 0o444, Size: f.Size, Format: tar.FormatPAX})
		if err == nil {
			var n int64
			if n, err = io.Copy(tw, io.LimitReader(src, f.Size)); err == nil && n != f.Size {
				err = fmt.Errorf("file %s: the staged copy has %d bytes, not %d", f.Name, n, f.Size)
			}
		}
		src.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

// takeFiles asks the pod's files-out helper for the reply's files and
// reads its answer within caps. Whatever goes wrong, each path gets its
// bytes, a refusal code, or Failed; nothing waits past the deadline.
func (s *session) takeFiles(ctx context.Context, want []agentproto.OutFile, caps isolation.FileCaps) []isolation.SandboxFile {
	var paths []string
	seen := map[string]bool{}
	for _, f := range want {
		rel := path.Clean(f.Path)
		if !seen[rel] && len(paths) < agentproto.MaxOutFiles {
			seen[rel] = true
			paths = append(paths, rel)
		}
	}
	if len(paths) == 0 || caps.File <= 0 {
		return nil
	}
	out := make([]isolation.SandboxFile, len(paths))
	for i, p := range paths {
		out[i].Path = p
	}
	ctx, cancel := context.WithTimeout(ctx, s.b.filesDeadline(caps.Total))
	defer cancel()
	req, _ := json.Marshal(agentproto.FilesOutRequest{Paths: paths, File: caps.File, Total: caps.Total})
	pr, pw := io.Pipe()
	execErr := make(chan error, 1)
	go func() {
		err := s.b.execFiles(ctx, s.ns, s.name, s.filesIn, []string{agentproto.FilesOutArg, isolation.ContainerWorkspace}, bytes.NewReader(req), pw)
		pw.CloseWithError(err)
		execErr <- err
	}()
	n, readErr := readOutbox(pr, out, caps)
	// A reader that stopped early (an answer out of bounds) ends the exec.
	pr.CloseWithError(errors.New("berth stopped reading the pod's answer"))
	cancel()
	err := <-execErr
	if readErr == nil && n < len(out) {
		readErr = errors.New("the pod's answer ended early")
		if err != nil {
			readErr = err
		}
	}
	if readErr != nil {
		s.b.log.Warn("cannot read all of a reply's files from its pod", "pod", s.name, "err", readErr)
		for i := n; i < len(out); i++ {
			out[i].Failed = "it could not be read from the pod (" + oneLine(readErr.Error()) + ")"
		}
	}
	return out
}

// readOutbox reads files-out's tar into out, in order, and says how many
// entries it took. The pod is hostile: an entry must be entry i, a regular
// file within the caps, its refusal a PAX record; the first that is not
// ends the reading.
func readOutbox(r io.Reader, out []isolation.SandboxFile, caps isolation.FileCaps) (int, error) {
	// Headers and PAX records besides the bytes; tar itself caps a PAX
	// record's size.
	limit := &io.LimitedReader{R: r, N: caps.Total + int64(len(out)+2)*(8<<10)}
	tr := tar.NewReader(limit)
	var total int64
	for i := range out {
		h, err := tr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) && limit.N <= 0 {
				err = errors.New("the pod's answer is larger than the caps allow")
			}
			return i, fmt.Errorf("cannot read entry %d of the pod's answer: %w", i, err)
		}
		if h.Name != strconv.Itoa(i) || h.Typeflag != tar.TypeReg {
			return i, fmt.Errorf("entry %d of the pod's answer is %q of type %q, not file %d", i, h.Name, h.Typeflag, i)
		}
		if refusal, ok := h.PAXRecords[agentproto.FilesRefusalRecord]; ok {
			if h.Size != 0 || len(refusal) > 128 {
				return i, fmt.Errorf("entry %d of the pod's answer is a refusal with bytes", i)
			}
			out[i].Refusal = refusal
			continue
		}
		if h.Size < 0 || h.Size > caps.File || total+h.Size > caps.Total {
			return i, fmt.Errorf("entry %d of the pod's answer has %d bytes, past the caps (%d a file, %d in all)", i, h.Size, caps.File, caps.Total)
		}
		data := make([]byte, h.Size)
		if _, err := io.ReadFull(tr, data); err != nil {
			return i, fmt.Errorf("cannot read entry %d of the pod's answer: %w", i, err)
		}
		total += h.Size
		out[i].Data = data
	}
	// The end of the archive, so the helper's exec ends as it should.
	if _, err := io.Copy(io.Discard, limit); err != nil {
		return len(out), err
	}
	return len(out), nil
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// filesHold keeps a one-shot pod until its reply's files were read:
// Release and the teardown of an answered run wait for it, and Kill leaves
// a pod whose agent already ended (nothing of its runs) to Release.
type filesHold struct {
	once     sync.Once
	released chan struct{}
	limit    time.Duration
}

// holdForFiles makes s wait for releaseFiles before it deletes its pod.
func (s *session) holdForFiles(files *isolation.RunFiles) {
	if files == nil || files.Out.File <= 0 {
		return
	}
	s.hold = &filesHold{released: make(chan struct{}), limit: s.b.filesDeadline(files.Out.Total) + s.b.apiTimeout}
}

func (s *session) releaseFiles() {
	if h := s.hold; h != nil {
		h.once.Do(func() { close(h.released) })
	}
}

// waitFiles waits until the reply's files were read, or the hold's limit.
func (s *session) waitFiles() {
	h := s.hold
	if h == nil {
		return
	}
	select {
	case <-h.released:
	case <-time.After(h.limit):
		s.b.log.Warn("the reply's files were not read in time; the pod is deleted", "pod", s.name)
	}
}

// heldAfterExit says Kill may leave the pod to Release: its agent ended
// (so nothing of the run is left in it) and its files are not read yet.
func (s *session) heldAfterExit() bool {
	if s.hold == nil || !s.agentEnded.Load() {
		return false
	}
	select {
	case <-s.hold.released:
		return false
	default:
		return true
	}
}

// superviseWithFiles is Run: the message's files go in before the request
// (startRun), the reply's files come out after the response, before the
// pod is deleted.
func (b *Backend) superviseWithFiles(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	var s *session
	res, err := isolation.Supervise(ctx, spec, func(ctx context.Context, spec isolation.Spec, input []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
		sb, err := b.startRun(ctx, spec, input, stdout, stderr)
		if e, ok := sb.(endingLater); ok {
			s = e.session
		}
		return sb, err
	})
	if s == nil {
		return res, err
	}
	defer s.releaseFiles()
	if err == nil && spec.Files != nil && res.Response.Error == "" && len(res.Response.Files) > 0 {
		res.ReplyFiles = s.takeFiles(context.WithoutCancel(ctx), res.Response.Files, spec.Files.Out)
	}
	return res, err
}

// filesKept is a kept pod that takes a run's files with its request.
type filesKept struct {
	isolation.Kept
	s *session
}

var _ isolation.FilesKeeper = filesKept{}

// RunWithFiles places files.In before the request and reads the reply's
// files after the response; the kept pod runs between requests, so its
// files container is there for both.
func (k filesKept) RunWithFiles(ctx context.Context, req agentproto.Request, files *isolation.RunFiles) (isolation.Result, error) {
	if err := k.s.putFiles(ctx, files); err != nil {
		return isolation.Result{}, err
	}
	res, err := k.Kept.Run(ctx, req)
	if err == nil && files != nil && res.Response.Error == "" && len(res.Response.Files) > 0 {
		res.ReplyFiles = k.s.takeFiles(context.WithoutCancel(ctx), res.Response.Files, files.Out)
	}
	return res, err
}
