package egress_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/services/egress"
)

var proxyBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-egress-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	proxyBinary = filepath.Join(dir, "berth-egress")
	build := exec.Command("go", "build", "-o", proxyBinary, "github.com/berth-dev/berth/cmd/berth-egress")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "cannot build berth-egress:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func launch(t *testing.T, runID, tok string, pol egress.Policy) (*egress.Proxy, string) {
	t.Helper()
	testenv.NeedRoot(t)
	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	os.Chmod(root, 0o755)
	socket := filepath.Join(root, "egress", runID, isolation.EgressSocketName)
	pol.RunID, pol.Token = runID, tok
	p, err := egress.Launch(context.Background(), pol, egress.LaunchOptions{Logger: quiet, Binary: proxyBinary, User: nobody, Client: nobody, Socket: socket})
	if err != nil {
		t.Fatal(err)
	}
	return p, socket
}

func TestTheProxyRunsUnprivilegedAndItsTokenEndsWithTheRun(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	p, socket := launch(t, "run1", token, egress.Policy{Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}})
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Uid:") && strings.Fields(line)[1] == "0" {
			t.Fatalf("the proxy runs as root: %s", line)
		}
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid()))
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.Pid()))
	if strings.Contains(string(cmdline)+string(environ), openKey) {
		t.Fatal("the key is in the proxy's argv or environment")
	}
	fi, err := os.Stat(socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode = %v, %v; want 0600 for the run user only", fi, err)
	}
	px := proxy{socket: socket}
	if code, body := do(t, px.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`); code != 200 {
		t.Fatalf("provider call through the proxy process: %d %q", code, body)
	}
	decisions := p.Stop().Decisions
	if len(decisions) != 1 || !decisions[0].Allowed {
		t.Fatalf("decisions = %+v, want the one allowed provider call", decisions)
	}
	if _, err := net.Dial("unix", socket); err == nil {
		t.Fatal("the run's socket still answers after the run ended")
	}
	if _, err := os.Stat(filepath.Dir(socket)); !os.IsNotExist(err) {
		t.Fatalf("the run's egress directory is left behind: %v", err)
	}
}

func TestARunCannotUseAnotherRunsSocket(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	pol := egress.Policy{Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}}
	a, _ := launch(t, "runa", "token-of-run-a-0123456789", pol)
	defer a.Stop()
	b, socketB := launch(t, "runb", "token-of-run-b-0123456789", pol)
	defer b.Stop()
	code, body := do(t, proxy{socket: socketB}.origin("token-of-run-a-0123456789"), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`)
	if code != http.StatusProxyAuthRequired {
		t.Fatalf("run a's token on run b's socket: %d %q, want 407", code, body)
	}
}

func TestTheProxyIsNeverStartedAsRoot(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	socket := filepath.Join(t.TempDir(), "egress", "r1", isolation.EgressSocketName)
	_, err := egress.Launch(context.Background(), egress.Policy{RunID: "r1", Token: token}, egress.LaunchOptions{Logger: quiet, Binary: proxyBinary, Socket: socket})
	if err == nil || !strings.Contains(err.Error(), "refusing to run it as root") {
		t.Fatalf("Launch without a user as root = %v, want a refusal", err)
	}
	if _, err := os.Stat(filepath.Dir(socket)); !os.IsNotExist(err) {
		t.Errorf("a refused launch left its directory: %v", err)
	}
}

func TestDecisionLogsNeverCarryTheKeyOrTheToken(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}}, egress.Options{Logger: log})
	do(t, p.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`)
	do(t, p.origin("wrong-token-0123456789"), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`)
	p.srv.Close()
	mu.Lock()
	defer mu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "run_id=r1") || !strings.Contains(out, "allowed=true") {
		t.Fatalf("decisions were not logged with run_id: %s", out)
	}
	for _, secret := range []string{openKey, token, "wrong-token-0123456789"} {
		if strings.Contains(out, secret) {
			t.Fatalf("the log holds a secret: %s", out)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestARecordKeepsTheRefusalAfter1000Allowed(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	p, socket := launch(t, "flood", token, egress.Policy{Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}})
	px := proxy{socket: socket}
	origin := px.origin(token)
	for i := range 1000 {
		if code, body := do(t, origin, "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`); code != 200 {
			t.Fatalf("provider call %d: %d %q", i, code, body)
		}
	}
	if code, _ := do(t, px.client(token), "GET", "http://files.example/secret-plans", ""); code != http.StatusForbidden {
		t.Fatalf("a host no rule allows: %d, want 403", code)
	}
	if code, body := do(t, origin, "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`); code != 200 {
		t.Fatalf("the last provider call: %d %q", code, body)
	}
	rec := p.Stop()

	n := len(rec.Decisions)
	if n != isolation.EgressFirstKept+isolation.EgressLastKept || rec.Dropped != 1002-n {
		t.Fatalf("kept %d, dropped %d; want the first %d and the last %d of 1002", n, rec.Dropped, isolation.EgressFirstKept, isolation.EgressLastKept)
	}
	refusal := rec.Decisions[n-2]
	if refusal.Allowed || refusal.Host != "files.example" || refusal.Path != "/secret-plans" {
		t.Errorf("the second to last decision kept is %+v, want the refusal of files.example", refusal)
	}
	if last := rec.Decisions[n-1]; !last.Allowed || last.Path != "/v1/chat/completions" {
		t.Errorf("the last decision kept is %+v, want the last provider call", last)
	}
	for i := 1; i < n; i++ {
		if rec.Decisions[i].Time.Before(rec.Decisions[i-1].Time) {
			t.Fatalf("decisions %d and %d are out of order", i-1, i)
		}
	}
	oaHost, _, _ := net.SplitHostPort(strings.TrimPrefix(oa.URL, "http://"))
	want := isolation.EgressCounts{Allowed: 1001, Refused: 1, Hosts: []isolation.EgressHostCount{
		{Host: oaHost, Allowed: 1001}, {Host: "files.example", Refused: 1},
	}}
	// Every provider call carries the same bytes; the refusal none.
	want.BytesUp, want.BytesDown = 1001*rec.Decisions[0].BytesUp, 1001*rec.Decisions[0].BytesDown
	if want.BytesUp == 0 || want.BytesDown == 0 {
		t.Errorf("the first decision carried %d bytes up and %d down, want the call's", rec.Decisions[0].BytesUp, rec.Decisions[0].BytesDown)
	}
	if got := fmt.Sprintf("%+v", rec.Counts); got != fmt.Sprintf("%+v", want) {
		t.Errorf("counts %s, want %s", got, fmt.Sprintf("%+v", want))
	}
}

func TestARecordKeepsRefusalsAndCountsHosts(t *testing.T) {
	t.Parallel()
	p, socket := launch(t, "scan", token, egress.Policy{})
	client := proxy{socket: socket}.client(token)
	const hosts = isolation.EgressHostsCounted + 6
	refusals := isolation.EgressFirstKept + isolation.EgressRefusalsKept + isolation.EgressLastKept + 20
	for i := range refusals {
		if code, _ := do(t, client, "GET", fmt.Sprintf("http://h%d.example/", i%hosts), ""); code != http.StatusForbidden {
			t.Fatalf("request %d: %d, want 403", i, code)
		}
	}
	rec := p.Stop()
	kept := isolation.EgressFirstKept + isolation.EgressRefusalsKept + isolation.EgressLastKept
	if len(rec.Decisions) != kept || rec.Dropped != refusals-kept {
		t.Errorf("kept %d, dropped %d; want %d kept and %d dropped", len(rec.Decisions), rec.Dropped, kept, refusals-kept)
	}
	if rec.Counts.Refused != refusals || len(rec.Counts.Hosts) != isolation.EgressHostsCounted {
		t.Fatalf("counts %+v: want %d refusals over %d hosts counted one by one", rec.Counts, refusals, isolation.EgressHostsCounted)
	}
	sum := rec.Counts.OtherHosts.Refused
	for _, h := range rec.Counts.Hosts {
		sum += h.Refused
	}
	if sum != refusals || rec.Counts.OtherHosts.Refused == 0 {
		t.Errorf("hosts and other hosts count %d refusals (other hosts %d), want all %d", sum, rec.Counts.OtherHosts.Refused, refusals)
	}
}

// A local user can neither list the runs' directories nor look into one;
// the run user reaches its socket and reads its CA bundle.
func TestOnlyTheRunUserReachesItsRunsEgressDirectory(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("curl")
	testenv.Need(t, err == nil, "curl is not installed")
	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	runUser := &isolation.RunUser{Name: "4242", UID: 4242, GID: 4242}
	other := &isolation.RunUser{Name: "4343", UID: 4343, GID: 4343}
	base, err := os.MkdirTemp("", "be-modes-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o755)
	root := filepath.Join(base, "egress")
	// An older scheduler left it listable.
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(root, "run1", isolation.EgressSocketName)
	p, err := egress.Launch(context.Background(), egress.Policy{RunID: "run1", Token: token}, egress.LaunchOptions{
		Logger: quiet, Binary: proxyBinary, User: nobody, Client: runUser, Socket: socket, CABundle: []byte("run CA\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	bundle := filepath.Join(filepath.Dir(socket), isolation.EgressCABundleName)
	as := func(u *isolation.RunUser, name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := as(other, "ls", root); err == nil {
		t.Errorf("another local user lists the run ids: %q", out)
	}
	if out, err := as(other, "cat", bundle); err == nil {
		t.Errorf("another local user reads the run's CA bundle: %q", out)
	}
	if out, err := as(other, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", socket, "http://egress/"); err == nil {
		t.Errorf("another local user reaches the run's socket: %q", out)
	}
	if out, err := as(runUser, "cat", bundle); err != nil || out != "run CA\n" {
		t.Errorf("the run user reads its CA bundle: %q, %v", out, err)
	}
	// 407: the socket answers, and the request has no token.
	if out, err := as(runUser, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", socket, "http://egress/"); err != nil || out != "407" {
		t.Errorf("the run user through its socket: %q, %v; want the proxy's 407", out, err)
	}
}

// The proxy is in a cgroup of its own, with its limits, from before it has
// the policy until its run ends; then the cgroup is gone.
func TestTheProxyRunsInACgroupOfItsOwnWhileItsRunLasts(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	os.Chmod(root, 0o755)
	socket := filepath.Join(root, "egress", "cg1", isolation.EgressSocketName)
	lim := hostrun.Limits{MemoryMax: 96 << 20, TasksMax: 50, CPUQuotaPercent: 100}
	var helper *hostrun.Helper
	var confineErr error
	p, err := egress.Launch(context.Background(), egress.Policy{RunID: "cg1", Token: token}, egress.LaunchOptions{
		Logger: quiet, Binary: proxyBinary, User: nobody, Client: nobody, Socket: socket, MemoryMax: int64(lim.MemoryMax),
		Confine: func(pid int) (func(), error) {
			helper, confineErr = hostrun.ConfineHelper(context.Background(), "egress", "cg1", pid, lim, false)
			if confineErr != nil {
				return nil, confineErr
			}
			return helper.Release, nil
		},
	})
	if confineErr != nil && strings.Contains(confineErr.Error(), "no writable cgroup") {
		testenv.Need(t, false, "no writable cgroup here: %v", confineErr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if helper == nil || len(helper.Dirs) == 0 {
		t.Fatal("the proxy got no cgroup")
	}
	pid := strconv.Itoa(p.Pid())
	var memory, tasks bool
	for _, dir := range helper.Dirs {
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || !slices.Contains(strings.Fields(string(procs)), pid) {
			t.Errorf("%s lists %q (%v), want the proxy's pid %s", dir, procs, err, pid)
		}
		for _, f := range []struct {
			file, want string
			seen       *bool
		}{
			{"memory.limit_in_bytes", "100663296", &memory}, {"memory.max", "100663296", &memory}, {"pids.max", "50", &tasks},
		} {
			if b, err := os.ReadFile(filepath.Join(dir, f.file)); err == nil {
				*f.seen = true
				if got := strings.TrimSpace(string(b)); got != f.want {
					t.Errorf("%s/%s = %s, want %s", dir, f.file, got, f.want)
				}
			}
		}
	}
	if !memory || !tasks {
		t.Errorf("the proxy's cgroups %v limit memory %v, tasks %v; want both", helper.Dirs, memory, tasks)
	}
	environ, _ := os.ReadFile("/proc/" + pid + "/environ")
	if !strings.Contains(string(environ), "GOMEMLIMIT=75497472") {
		t.Errorf("the proxy's environment has no GOMEMLIMIT of 3/4 of its memory: %q", environ)
	}
	p.Stop()
	for _, dir := range helper.Dirs {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the proxy's cgroup %s is left after its run: %v", dir, err)
		}
	}
}
