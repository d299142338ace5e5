// Package cockpittest runs real Cockpit for tests: Debian's cockpit-ws with a
// local session of cockpit-bridge (no login, no systemd), the bridge's system
// bus pointed at a private bus and berth's cockpit/ directory shown as the
// package "berth" — and a headless Chromium driven over the DevTools
// protocol. Nothing of Cockpit is faked: the page talks to the bus through
// the bridge exactly as it does on an installed system.
package cockpittest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// Where Debian's packages put the programs (cockpit-ws is not on PATH).
var (
	wsCandidates     = []string{"/usr/lib/cockpit/cockpit-ws", "/usr/libexec/cockpit-ws"}
	bridgeCandidates = []string{"/usr/bin/cockpit-bridge"}
	shellManifest    = "/usr/share/cockpit/shell/manifest.json"
)

// Programs are the Cockpit binaries a test needs.
type Programs struct {
	WS, Bridge string
}

// FindPrograms looks for cockpit-ws and cockpit-bridge; the error names the
// Debian packages to install.
func FindPrograms() (Programs, error) {
	var p Programs
	p.WS = firstExisting(wsCandidates)
	if path, err := exec.LookPath("cockpit-bridge"); err == nil {
		p.Bridge = path
	} else {
		p.Bridge = firstExisting(bridgeCandidates)
	}
	if p.WS == "" || p.Bridge == "" {
		return p, errors.New("cockpit-ws and cockpit-bridge are not installed (apt-get install cockpit-ws cockpit-bridge cockpit-system)")
	}
	return p, nil
}

// NeedCockpit returns Cockpit's programs, or fails (CI=true) or skips the
// test when they are missing.
func NeedCockpit(t testing.TB) Programs {
	t.Helper()
	p, err := FindPrograms()
	testenv.Need(t, err == nil, "%v", err)
	return p
}

// HasShell says whether Cockpit's shell (package cockpit-system) is
// installed: without it only the page itself can be opened, not the frame
// around it.
func HasShell() bool {
	_, err := os.Stat(shellManifest)
	return err == nil
}

func firstExisting(paths []string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// Options describes one Cockpit session.
type Options struct {
	// BusAddress is the system bus the bridge (and so the page) talks to.
	BusAddress string
	// PackageDir is berth's cockpit/ directory; the bridge lists it as
	// package "berth".
	PackageDir string
	// User runs cockpit-ws and its bridge; "" is the test's own user.
	// Another user needs the test to run as root.
	User string
	// Dir holds the session's files; it must be reachable by User.
	Dir string
}

// Server is a running cockpit-ws with a local bridge session.
type Server struct {
	// URL is the web server's root, e.g. http://127.0.0.1:41234.
	URL     string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
}

// Start runs cockpit-ws on a free loopback port until the test ends.
func Start(t testing.TB, progs Programs, opts Options) *Server {
	t.Helper()
	s, err := StartServer(progs, opts)
	if err != nil {
		t.Fatalf("cannot start cockpit-ws: %v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			if b, err := os.ReadFile(s.LogPath); err == nil && len(b) > 0 {
				t.Logf("cockpit-ws and cockpit-bridge (%s) said:\n%s", opts.User, tail(b, 6000))
			}
		}
	})
	return s
}

// StartServer runs cockpit-ws outside a test's lifetime; call Stop.
func StartServer(progs Programs, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("cockpittest: Options.Dir is required")
	}
	pkgDir, err := filepath.Abs(opts.PackageDir)
	if err != nil {
		return nil, fmt.Errorf("cannot resolve %s: %w", opts.PackageDir, err)
	}
	if _, err := os.Stat(filepath.Join(pkgDir, "manifest.json")); err != nil {
		return nil, fmt.Errorf("no Cockpit package in %s: %w", pkgDir, err)
	}
	// The bridge finds packages in $XDG_DATA_DIRS/cockpit/<name>.
	data := filepath.Join(opts.Dir, "data")
	home := filepath.Join(opts.Dir, "home")
	for _, d := range []string{filepath.Join(data, "cockpit"), home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cannot create %s: %w", d, err)
		}
	}
	link := filepath.Join(data, "cockpit", "berth")
	_ = os.Remove(link)
	if err := os.Symlink(pkgDir, link); err != nil {
		return nil, fmt.Errorf("cannot link the package: %w", err)
	}

	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{
		URL:     "http://127.0.0.1:" + strconv.Itoa(port),
		LogPath: filepath.Join(opts.Dir, "cockpit.log"),
		done:    make(chan struct{}),
	}
	logFile, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cannot open cockpit log: %w", err)
	}
	defer logFile.Close()

	cmd := exec.Command(progs.WS, "--no-tls", "--address=127.0.0.1", "--port="+strconv.Itoa(port), "--local-session="+progs.Bridge)
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + home,
		"LANG=C.UTF-8",
		"XDG_DATA_DIRS=" + data + ":/usr/local/share:/usr/share",
		"XDG_DATA_HOME=" + filepath.Join(home, ".local", "share"),
		"XDG_CACHE_HOME=" + filepath.Join(home, ".cache"),
		"XDG_RUNTIME_DIR=" + home,
		"DBUS_SYSTEM_BUS_ADDRESS=" + opts.BusAddress,
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if opts.User != "" {
		cred, err := credential(opts.User)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr.Credential = cred
		if err := os.Chown(home, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("cannot give %s its home: %w", opts.User, err)
		}
		cmd.Env = append(cmd.Env, "USER="+opts.User, "LOGNAME="+opts.User)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start %s: %w", progs.WS, err)
	}
	s.cmd = cmd
	go func() { _ = cmd.Wait(); close(s.done) }()

	if err := s.waitReady(15 * time.Second); err != nil {
		s.Stop()
		log, _ := os.ReadFile(s.LogPath)
		return nil, fmt.Errorf("%w\n%s", err, tail(log, 4000))
	}
	return s, nil
}

func credential(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("cannot find user %s: %w", name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// waitReady waits until cockpit-ws answers HTTP.
func (s *Server) waitReady(timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("cockpit-ws exited")
		default:
		}
		resp, err := client.Get(s.URL + "/cockpit/login")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("cockpit-ws did not answer on %s within %v", s.URL, timeout)
}

// PageURL is berth's page on its own, outside Cockpit's frame; fragment is
// the page's location, e.g. "/runs".
func (s *Server) PageURL(fragment string) string {
	u := s.URL + "/cockpit/@localhost/berth/index.html"
	if fragment != "" {
		u += "#" + fragment
	}
	return u
}

// ShellURL is berth's page inside Cockpit's shell, as a user opens it.
func (s *Server) ShellURL(fragment string) string {
	u := s.URL + "/berth"
	if fragment != "" {
		u += "#" + fragment
	}
	return u
}

// Stop ends cockpit-ws and its bridge.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cannot find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// lockedWriter lets Chromium's output goroutine and a test's log read share
// one buffer.
type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
