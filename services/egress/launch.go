package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
)

// NewToken returns a fresh run token.
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("cannot make a run token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// childConfig is what the proxy process reads on stdin (one JSON line): the
// keys travel here, never in its argv or environment.
type childConfig struct {
	Policy Policy `json:"policy"`
	// RootCAsPEM adds CAs that upstream TLS may be signed by (tests).
	RootCAsPEM string `json:"root_cas_pem,omitempty"`
	// Answers says the scheduler answers asks (LaunchOptions.OnAsk): without
	// it, a request an ask rule matches is refused at once, not held.
	Answers bool `json:"answers,omitempty"`
}

// LaunchOptions say how one run's proxy process is started.
type LaunchOptions struct {
	// Binary is berth-egress.
	Binary string
	// User is the proxy's own unprivileged user; nil runs it as the caller
	// (only when the caller is not root).
	User *isolation.RunUser
	// Socket is the run's socket path; its directory is made for the run
	// and removed by Stop.
	Socket string
	// Client is the run user, the only one (besides root) who may connect.
	Client *isolation.RunUser
	Logger *slog.Logger
	// RootCAsPEM: see childConfig.
	RootCAsPEM []byte
	// UpstreamCAFile, when set, is the SSL_CERT_FILE the proxy verifies
	// upstream TLS with (instead of the system's bundle).
	UpstreamCAFile string
	// CABundle, when set, is written to the run's directory as
	// isolation.EgressCABundleName for the sandbox to trust.
	CABundle []byte
	// StopTimeout bounds how long Stop waits for the process (5 s).
	StopTimeout time.Duration
	// Confine, when set, puts the started process into limits of its own
	// before it gets the policy; the release it returns runs once the
	// process has ended. An error ends the launch.
	Confine func(pid int) (release func(), err error)
	// MemoryMax, when set, is the memory the process is confined to: its
	// Go runtime collects harder as it nears it (GOMEMLIMIT).
	MemoryMax int64
	// OnDecision, when set, is told each decision as the proxy reports it
	// (a kept sandbox's activity); it must not block.
	OnDecision func(isolation.EgressDecision)
	// OnCall, when set, is told each provider call as the proxy reports
	// it, with its usage (the scheduler's budgets); it must not block.
	OnCall func(egresspolicy.Call)
	// OnAsk, when set, is told each request the proxy holds for a
	// person's answer (an [agents.egress] ask rule matched it), which
	// Proxy.Answer gives; it is called from the proxy's stdout reader and
	// must not block. Without it, such requests are refused at once.
	OnAsk func(egresspolicy.Ask)
	// OnAskSettled, when set, is told how each ask ended (egress.Options
	// has the details): what closes a pending approval that nobody, or
	// the timeout, answered. It must not block.
	OnAskSettled func(egresspolicy.Answer)
}

// MakeRoot makes the directory of the runs' egress directories, or sets
// its mode: 0711, so a run user reaches its own run's directory by its path
// but no local user can list the run ids.
func MakeRoot(root string) error {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return fmt.Errorf("cannot create the egress directory: %w", err)
	}
	if err := os.Chmod(root, 0o711); err != nil {
		return fmt.Errorf("cannot set the egress directory's mode: %w", err)
	}
	return nil
}

// runAccess is who may use a run's directory besides its owner: the run
// user's group, when the scheduler is root and can hand it over; anyone
// who knows the path otherwise (the run then runs as the scheduler's user,
// or the scheduler cannot chown).
type runAccess struct{ gid int }

func runAccessFor(client *isolation.RunUser) runAccess {
	if client == nil || os.Geteuid() != 0 {
		return runAccess{gid: -1}
	}
	return runAccess{gid: int(client.GID)}
}

// apply gives path to root and the run user's group with groupMode, or
// sets openMode when there is no group to give it to.
func (a runAccess) apply(path string, groupMode, openMode os.FileMode) error {
	if a.gid < 0 {
		return os.Chmod(path, openMode)
	}
	if err := os.Chown(path, 0, a.gid); err != nil {
		return err
	}
	return os.Chmod(path, groupMode)
}

// writeBundle writes the CA bundle the sandbox trusts: readable by the run
// user only. When the scheduler trusts upstreams through a CA file of its
// own (SSL_CERT_FILE), that file's certificates lead the bundle, so a tool
// whose SSL_CERT_FILE now names the bundle trusts what the proxy does.
func writeBundle(path string, opts LaunchOptions, access runAccess) error {
	bundle := opts.CABundle
	if opts.UpstreamCAFile != "" {
		upstream, err := os.ReadFile(opts.UpstreamCAFile)
		if err != nil {
			return fmt.Errorf("cannot read the upstream CA file %s: %w", opts.UpstreamCAFile, err)
		}
		bundle = append(append(upstream, '\n'), bundle...)
	}
	if err := os.WriteFile(path, bundle, 0o600); err != nil {
		return fmt.Errorf("cannot write the run's CA bundle: %w", err)
	}
	if err := access.apply(path, 0o640, 0o644); err != nil {
		return fmt.Errorf("cannot let the run user read its CA bundle: %w", err)
	}
	return nil
}

// Proxy is a started proxy process.
type Proxy struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	dir     string
	timeout time.Duration
	log     *slog.Logger
	done    chan struct{}
	release func()
	// onDecision is LaunchOptions.OnDecision, onCall LaunchOptions.OnCall.
	onDecision func(isolation.EgressDecision)
	onCall     func(egresspolicy.Call)
	onAsk      func(egresspolicy.Ask)
	onSettled  func(egresspolicy.Answer)

	mu    sync.Mutex
	rec   record
	usage egresspolicy.Usage // the provider calls of the record
	// stdinMu orders the lines written after the policy (allowances, answers).
	stdinMu sync.Mutex
	// agentToken is the policy's AgentToken (channel.go).
	agentToken string
}

// Record is a run's egress record: the decisions it keeps (the first and
// last ones and the refusals), how many more there were, and all of them
// counted.
type Record struct {
	Decisions []isolation.EgressDecision
	Dropped   int
	Counts    isolation.EgressCounts
	// Usage is what the provider calls spent (usage.go).
	Usage egresspolicy.Usage
}

// Launch creates the run's socket, starts the proxy process on it as
// opts.User and hands it the policy on stdin.
func Launch(ctx context.Context, pol Policy, opts LaunchOptions) (p *Proxy, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 5 * time.Second
	}
	if opts.User == nil && os.Geteuid() == 0 {
		return nil, errors.New("cannot start the egress proxy: refusing to run it as root; set [scheduler] egress_user")
	}
	if opts.User != nil && opts.User.UID == 0 {
		return nil, errors.New("cannot start the egress proxy: egress_user is root")
	}
	dir := filepath.Dir(opts.Socket)
	if err := MakeRoot(filepath.Dir(dir)); err != nil {
		return nil, err
	}
	// A run run again (after a scheduler crash) starts with a fresh directory.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("cannot clear the run's egress directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot create the run's egress directory: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	access := runAccessFor(opts.Client)
	if len(opts.CABundle) > 0 {
		if err := writeBundle(filepath.Join(dir, isolation.EgressCABundleName), opts, access); err != nil {
			return nil, err
		}
	}
	// Last, once everything in it is in place: the run user may enter.
	if err := access.apply(dir, 0o750, 0o711); err != nil {
		return nil, fmt.Errorf("cannot open the run's egress directory to the run user: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: opts.Socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("cannot create the run's egress socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("cannot hand over the egress socket: %w", err)
	}
	defer lf.Close()
	mode := os.FileMode(0o666)
	if opts.Client != nil && os.Geteuid() == 0 {
		if err := os.Chown(opts.Socket, int(opts.Client.UID), int(opts.Client.GID)); err != nil {
			return nil, fmt.Errorf("cannot hand the egress socket to %s: %w", opts.Client.Name, err)
		}
		mode = 0o600
	}
	if err := os.Chmod(opts.Socket, mode); err != nil {
		return nil, fmt.Errorf("cannot set the egress socket's mode: %w", err)
	}

	cfg, err := json.Marshal(childConfig{Policy: pol, RootCAsPEM: string(opts.RootCAsPEM), Answers: opts.OnAsk != nil})
	if err != nil {
		return nil, fmt.Errorf("cannot encode the egress policy: %w", err)
	}
	cmd := exec.Command(opts.Binary)
	// TMPDIR on disk: a push kept to be judged (git.go) must not fill a
	// tmpfs /tmp, which would count against the proxy's memory.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "TMPDIR=/var/tmp"}
	if opts.UpstreamCAFile != "" {
		cmd.Env = append(cmd.Env, "SSL_CERT_FILE="+opts.UpstreamCAFile)
	}
	if opts.MemoryMax > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("GOMEMLIMIT=%d", opts.MemoryMax*3/4))
	}
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{lf}
	// No Pdeathsig: it fires when the forking thread ends, which the Go
	// runtime may do at any time. The proxy ends when its stdin closes,
	// which the scheduler's exit does too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if opts.User != nil && os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: opts.User.UID, Gid: opts.User.GID, Groups: []uint32{}}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("cannot start the egress proxy: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("cannot start the egress proxy: %w", err)
	}
	cmd.Stderr = &logWriter{log: opts.Logger.With("run_id", pol.RunID, "agent", pol.Agent)}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start the egress proxy %s: %w", opts.Binary, err)
	}
	p = &Proxy{cmd: cmd, stdin: stdin, dir: dir, timeout: opts.StopTimeout, done: make(chan struct{}),
		log: opts.Logger.With("run_id", pol.RunID, "agent", pol.Agent), onDecision: opts.OnDecision, onCall: opts.OnCall, onAsk: opts.OnAsk, onSettled: opts.OnAskSettled}
	p.agentToken = pol.AgentToken
	ready := make(chan error, 1)
	go p.read(stdout, ready)
	// Confined before it has the policy, so before it serves anything.
	if opts.Confine != nil {
		release, err := opts.Confine(cmd.Process.Pid)
		if err != nil {
			p.Stop()
			return nil, fmt.Errorf("cannot start the egress proxy: %w", err)
		}
		p.release = sync.OnceFunc(release)
	}
	if _, err := stdin.Write(append(cfg, '\n')); err != nil {
		p.Stop()
		return nil, fmt.Errorf("cannot hand the policy to the egress proxy: %w", err)
	}
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = context.Cause(ctx)
	case <-time.After(opts.StopTimeout):
		err = errors.New("it did not report ready")
	}
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("cannot start the egress proxy: %w", err)
	}
	return p, nil
}

// childLine is one line the proxy writes on stdout.
type childLine struct {
	Ready    bool                      `json:"ready,omitempty"`
	Error    string                    `json:"error,omitempty"`
	Decision *isolation.EgressDecision `json:"decision,omitempty"`
	Call     *egresspolicy.Call        `json:"call,omitempty"`
	// Ask is a request held for a person's answer (ask.go).
	Ask *egresspolicy.Ask `json:"ask,omitempty"`
	// Settled is how an ask ended (Options.OnAskSettled).
	Settled *egresspolicy.Answer `json:"settled,omitempty"`
}

// stdinLine is one line the scheduler writes to the proxy after the
// policy: a newer allowance (budget.go), or the answer to an ask (ask.go).
type stdinLine struct {
	Allowance *egresspolicy.Allowance `json:"allowance,omitempty"`
	Answer    *egresspolicy.Answer    `json:"answer,omitempty"`
}

func (p *Proxy) read(stdout io.Reader, ready chan<- error) {
	defer close(p.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	reported := false
	for sc.Scan() {
		var l childLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch {
		case l.Ready && !reported:
			reported = true
			ready <- nil
		case l.Error != "" && !reported:
			reported = true
			ready <- errors.New(l.Error)
		case l.Decision != nil:
			logDecision(p.log, *l.Decision)
			p.mu.Lock()
			p.rec.add(*l.Decision)
			p.mu.Unlock()
			if p.onDecision != nil {
				p.onDecision(*l.Decision)
			}
		case l.Call != nil:
			p.mu.Lock()
			p.usage.Add(*l.Call)
			p.mu.Unlock()
			if p.onCall != nil {
				p.onCall(*l.Call)
			}
		case l.Ask != nil:
			p.log.Info("egress ask", "ask_id", l.Ask.ID, "what", l.Ask.What(), "rule", l.Ask.Rule)
			if p.onAsk != nil {
				p.onAsk(*l.Ask)
			}
		case l.Settled != nil:
			p.log.Info("egress ask settled", "ask_id", l.Settled.ID, "allowed", l.Settled.Allow, "by", l.Settled.By)
			if p.onSettled != nil {
				p.onSettled(*l.Settled)
			}
		}
	}
	if !reported {
		ready <- errors.New("it exited before it was ready")
	}
}

// Stop revokes the run's token (the process ends and with it every
// connection), removes the socket and returns the run's egress record.
func (p *Proxy) Stop() Record {
	p.stdin.Close()
	// The decisions still in the stdout pipe are read to its end before
	// Wait, which closes the pipe's reading end and would drop them.
	select {
	case <-p.done:
	case <-time.After(p.timeout):
		p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(p.timeout):
		}
	}
	exited := make(chan struct{})
	go func() { p.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(p.timeout):
		p.cmd.Process.Kill()
		<-exited
	}
	if p.release != nil {
		p.release()
	}
	if err := os.RemoveAll(p.dir); err != nil {
		p.log.Warn("cannot remove the run's egress directory", "err", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var rec Record
	rec.Decisions, rec.Dropped, rec.Counts = p.rec.result()
	rec.Usage = p.usage
	return rec
}

// Cut returns the record so far and starts a fresh one: a kept sandbox's
// proxy outlives each run, and each run's record keeps its own decisions.
// Decisions still on their way from the proxy land in the next record.
func (p *Proxy) Cut() Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	var rec Record
	rec.Decisions, rec.Dropped, rec.Counts = p.rec.result()
	rec.Usage = p.usage
	p.rec, p.usage = record{}, egresspolicy.Usage{}
	return rec
}

// SetAllowance hands the running proxy a newer allowance (a raised
// budget, or the agent's other runs' spending counted). The proxy reads
// its stdin all the time, so the write does not wait on it.
func (p *Proxy) SetAllowance(a egresspolicy.Allowance) error {
	return p.writeLine(stdinLine{Allowance: &a}, "the allowance")
}

// Answer hands the running proxy a person's answer to one of its asks
// (OnAsk). An answer to an ask the proxy no longer holds is ignored there
// (and logged).
func (p *Proxy) Answer(a egresspolicy.Answer) error {
	return p.writeLine(stdinLine{Answer: &a}, "the answer")
}

// writeLine writes l, what, on the proxy's stdin.
func (p *Proxy) writeLine(l stdinLine, what string) error {
	line, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("cannot encode %s: %w", what, err)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("cannot hand %s to the egress proxy: %w", what, err)
	}
	return nil
}

// Pid is the proxy process's pid.
func (p *Proxy) Pid() int { return p.cmd.Process.Pid }

// RunChild is berth-egress: it serves the listener on fd 3 with the policy
// read from stdin until stdin closes, writing each decision to stdout.
func RunChild(stdin io.Reader, stdout io.Writer, log *slog.Logger) error {
	// Its memory holds provider keys: no core dumps, no ptrace by others.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("cannot make the egress proxy non-dumpable: %w", err)
	}
	var mu sync.Mutex
	enc := json.NewEncoder(stdout)
	emit := func(l childLine) {
		mu.Lock()
		enc.Encode(l)
		mu.Unlock()
	}
	fail := func(err error) error {
		emit(childLine{Error: err.Error()})
		return err
	}
	if os.Geteuid() == 0 {
		return fail(errors.New("berth-egress refuses to run as root"))
	}
	in := bufio.NewReader(stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fail(fmt.Errorf("cannot read the policy: %w", err))
	}
	var cfg childConfig
	if err := json.Unmarshal(line, &cfg); err != nil {
		return fail(fmt.Errorf("cannot decode the policy: %w", err))
	}
	opts := Options{Logger: log, OnDecision: func(d isolation.EgressDecision) { emit(childLine{Decision: &d}) },
		OnCall: func(c egresspolicy.Call) { emit(childLine{Call: &c}) }}
	if cfg.Answers {
		opts.OnAsk = func(a egresspolicy.Ask) { emit(childLine{Ask: &a}) }
		opts.OnAskSettled = func(a egresspolicy.Answer) { emit(childLine{Settled: &a}) }
	}
	if cfg.RootCAsPEM != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pool.AppendCertsFromPEM([]byte(cfg.RootCAsPEM))
		opts.RootCAs = pool
	}
	srv, err := NewServer(cfg.Policy, opts)
	if err != nil {
		return fail(err)
	}
	lf := os.NewFile(3, "egress.sock")
	ln, err := net.FileListener(lf)
	lf.Close()
	if err != nil {
		return fail(fmt.Errorf("cannot use the socket on fd 3: %w", err))
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	emit(childLine{Ready: true})
	// stdin closes when the run ends (or the scheduler dies): the token is
	// revoked with the process. Until then it brings newer allowances and
	// the answers to asks.
	readStdin(in, srv, log)
	srv.Close()
	return <-served
}

// readStdin hands srv each allowance and answer on in until it closes; a
// line longer than 64 KiB, or one it cannot read, is skipped, and so is an
// answer to an ask srv does not hold.
func readStdin(in io.Reader, srv *Server, log *slog.Logger) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 4<<10), 64<<10)
	for {
		for sc.Scan() {
			var l stdinLine
			err := json.Unmarshal(sc.Bytes(), &l)
			switch {
			case err == nil && l.Allowance != nil:
				srv.SetAllowance(*l.Allowance)
			case err == nil && l.Answer != nil:
				if err := srv.Answer(*l.Answer); err != nil {
					log.Warn("egress proxy: an answer is ignored", "ask_id", l.Answer.ID, "err", err)
				}
			default:
				log.Warn("egress proxy: a line on stdin is neither an allowance nor an answer", "err", err)
			}
		}
		if !errors.Is(sc.Err(), bufio.ErrTooLong) {
			return
		}
		sc = bufio.NewScanner(in) // past the long line's rest, a fresh one
		sc.Buffer(make([]byte, 4<<10), 64<<10)
	}
}

// logWriter logs what the proxy writes on stderr.
type logWriter struct {
	log *slog.Logger
	mu  sync.Mutex
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			if len(w.buf) > 8<<10 {
				w.buf = w.buf[:0]
			}
			return len(p), nil
		}
		w.log.Info("egress proxy: " + string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}
