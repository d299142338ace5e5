// Package gitforge is a git forge for tests: real repositories served by
// git http-backend (under net/http/cgi) over TLS, private to an
// installation token or a fixed token, and a fake of the part of GitHub's
// API that berth's egress proxy uses — installation tokens created with
// the app's RS256 JWT and revoked with DELETE /installation/token, and
// compare, answered from the forge's own repositories by git merge-base.
package gitforge

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// Options shape a forge.
type Options struct {
	// ForgeName and APIName are the host names the servers' certificates
	// name; empty serves on 127.0.0.1 with httptest's certificate (for a
	// proxy that resolves with the system's resolver).
	ForgeName, APIName string
	// Token is a fixed token the forge takes besides the app's (an
	// [[egress.secrets]] credential).
	Token string
	// FirstTokenLifetime is the first installation token's (an hour when
	// zero).
	FirstTokenLifetime time.Duration
}

// Forge is a running forge and its app API.
type Forge struct {
	t     testing.TB
	Repos string // the repositories, owner/name.git
	URL   string // https://<name>:<port>
	App   *App
	srv   *httptest.Server
	token string
	home  string

	mu       sync.Mutex
	received []Request
}

// Request is one request the forge received.
type Request struct {
	Method, Path, Query, Authorization, Protocol string
}

// New starts a forge; the servers end with the test.
func New(t testing.TB, o Options) *Forge {
	t.Helper()
	git, err := exec.LookPath("git")
	testenv.Need(t, err == nil, "this test needs git")
	execPath, err := exec.Command(git, "--exec-path").Output()
	if err != nil {
		t.Fatalf("cannot find git's exec path: %v", err)
	}
	f := &Forge{t: t, Repos: t.TempDir(), token: o.Token, home: t.TempDir()}
	os.WriteFile(filepath.Join(f.home, ".gitconfig"), []byte("[user]\n\tname = admin\n\temail = admin@forge.test\n[init]\n\tdefaultBranch = main\n"), 0o644)
	f.App = newApp(t, f.Repos, o)
	backend := &cgi.Handler{Path: filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend"),
		Env: []string{"GIT_PROJECT_ROOT=" + f.Repos, "GIT_HTTP_EXPORT_ALL=1", "HOME=" + f.home, "PATH=" + os.Getenv("PATH")}}
	f.srv = serveTLS(t, o.ForgeName, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.received = append(f.received, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Authorization: r.Header.Get("Authorization"), Protocol: r.Header.Get("Git-Protocol")})
		f.mu.Unlock()
		// Private repositories: a live installation token, or the fixed one.
		if user, pass, ok := r.BasicAuth(); !ok || user != "x-access-token" || !f.App.Valid(pass) && (f.token == "" || pass != f.token) {
			w.Header().Set("WWW-Authenticate", `Basic realm="forge"`)
			http.Error(w, "Authentication required", http.StatusUnauthorized)
			return
		}
		if r.ContentLength < 0 {
			// A real forge takes git's chunked pushes; Go's CGI host does not.
			body, _ := io.ReadAll(r.Body)
			r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(body)), int64(len(body)), nil
		}
		backend.ServeHTTP(w, r)
	}))
	f.URL = serverURL(f.srv, o.ForgeName)
	return f
}

// Roots trusts the forge's and the API's certificates.
func (f *Forge) Roots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(f.srv.Certificate())
	pool.AddCert(f.App.srv.Certificate())
	return pool
}

// RootsPEM is Roots as PEM.
func (f *Forge) RootsPEM() []byte {
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	return append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.App.srv.Certificate().Raw})...)
}

// Seed makes a bare repository (owner/name) with one commit on main.
func (f *Forge) Seed(repo string) {
	f.t.Helper()
	bare := filepath.Join(f.Repos, repo+".git")
	work := f.t.TempDir()
	f.Admin("", "init", "-q", "--bare", bare)
	f.Admin(bare, "config", "http.receivepack", "true")
	f.Admin(work, "init", "-q")
	os.WriteFile(filepath.Join(work, "README"), []byte("the "+repo+" repository\n"), 0o644)
	f.Admin(work, "add", "README")
	f.Admin(work, "commit", "-q", "-m", "first")
	f.Admin(work, "push", "-q", bare, "main")
}

// Bare is the path of repo's bare repository.
func (f *Forge) Bare(repo string) string { return filepath.Join(f.Repos, repo+".git") }

// Admin runs git as the forge's admin: on its files, without a proxy.
func (f *Forge) Admin(dir string, args ...string) string {
	f.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + f.home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		f.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// Ref is ref's id in repo ("" when it has none).
func (f *Forge) Ref(repo, ref string) string {
	out, _ := exec.Command("git", "-C", f.Bare(repo), "rev-parse", "--verify", "-q", ref).Output()
	return strings.TrimSpace(string(out))
}

// Received are the requests the forge received, oldest first.
func (f *Forge) Received() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.received...)
}

// App is the fake GitHub App API.
type App struct {
	URL            string
	AppID          int64
	InstallationID int64
	srv            *httptest.Server
	key            *rsa.PrivateKey
	repos          string
	firstLifetime  time.Duration

	mu       sync.Mutex
	minted   []string
	revoked  map[string]bool
	asked    []string
	compares int
}

func newApp(t testing.TB, repos string, o Options) *App {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	a := &App{AppID: 4242, InstallationID: 77, key: key, repos: repos, firstLifetime: o.FirstTokenLifetime, revoked: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /app/installations/{id}/access_tokens", a.createToken)
	mux.HandleFunc("DELETE /installation/token", a.revokeToken)
	mux.HandleFunc("GET /repos/{owner}/{repo}/compare/{range}", a.compare)
	a.srv = serveTLS(t, o.APIName, mux)
	a.URL = serverURL(a.srv, o.APIName)
	return a
}

// PrivateKeyPEM is the app's key, as the admin's credential file holds it.
func (a *App) PrivateKeyPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(a.key)}))
}

// Minted are the tokens created, and each creation's request body.
func (a *App) Minted() (tokens, asked []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.minted...), append([]string(nil), a.asked...)
}

// Compares counts the compare calls answered.
func (a *App) Compares() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.compares
}

// Valid says whether tok was minted and not revoked.
func (a *App) Valid(tok string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.minted {
		if m == tok {
			return !a.revoked[tok]
		}
	}
	return false
}

func githubError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"message": msg, "documentation_url": "https://docs.github.com/rest"})
}

func (a *App) createToken(w http.ResponseWriter, r *http.Request) {
	signed, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	var claims jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(signed, &claims, func(*jwt.Token) (any, error) { return &a.key.PublicKey, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithIssuedAt(), jwt.WithExpirationRequired())
	if !ok || err != nil || claims.Issuer != strconv.FormatInt(a.AppID, 10) {
		githubError(w, http.StatusUnauthorized, "A JSON web token could not be decoded")
		return
	}
	if r.PathValue("id") != strconv.FormatInt(a.InstallationID, 10) {
		githubError(w, http.StatusNotFound, "Not Found")
		return
	}
	body, _ := io.ReadAll(r.Body)
	b := make([]byte, 18)
	rand.Read(b)
	tok := "ghs_" + hex.EncodeToString(b)
	a.mu.Lock()
	lifetime := time.Hour
	if len(a.minted) == 0 && a.firstLifetime > 0 {
		lifetime = a.firstLifetime
	}
	a.minted = append(a.minted, tok)
	a.asked = append(a.asked, string(body))
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{"token": tok, "expires_at": time.Now().Add(lifetime).UTC().Format(time.RFC3339),
		"permissions": map[string]string{"contents": "write"}, "repository_selection": "selected"})
}

func (a *App) tokenOf(r *http.Request) (string, bool) {
	auth := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		tok, ok = strings.CutPrefix(auth, "token ")
	}
	return tok, ok && a.Valid(tok)
}

func (a *App) revokeToken(w http.ResponseWriter, r *http.Request) {
	tok, ok := a.tokenOf(r)
	if !ok {
		githubError(w, http.StatusUnauthorized, "Bad credentials")
		return
	}
	a.mu.Lock()
	a.revoked[tok] = true
	a.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (a *App) compare(w http.ResponseWriter, r *http.Request) {
	if _, ok := a.tokenOf(r); !ok {
		githubError(w, http.StatusUnauthorized, "Bad credentials")
		return
	}
	a.mu.Lock()
	a.compares++
	a.mu.Unlock()
	base, head, ok := strings.Cut(r.PathValue("range"), "...")
	repo := filepath.Join(a.repos, r.PathValue("owner"), r.PathValue("repo")+".git")
	isAncestor := func(x, y string) (yes, known bool) {
		err := exec.Command("git", "-C", repo, "merge-base", "--is-ancestor", x, y).Run()
		if exit, isExit := err.(*exec.ExitError); isExit && exit.ExitCode() == 1 {
			return false, true
		}
		return err == nil, err == nil
	}
	ahead, known1 := isAncestor(base, head)
	behind, known2 := isAncestor(head, base)
	if !ok || !known1 || !known2 {
		githubError(w, http.StatusNotFound, "Not Found")
		return
	}
	status := "diverged"
	switch {
	case ahead && behind:
		status = "identical"
	case ahead:
		status = "ahead"
	case behind:
		status = "behind"
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"url": r.URL.String(), "status": status, "files": []any{}})
}

// serveTLS serves h over TLS with a certificate for name, or on
// 127.0.0.1 with httptest's when name is empty.
func serveTLS(t testing.TB, name string, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	if name != "" {
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{certificateFor(t, name)}}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func serverURL(srv *httptest.Server, name string) string {
	if name == "" {
		return srv.URL
	}
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return "https://" + name + ":" + port
}

// certificateFor is a self-signed certificate naming host.
func certificateFor(t testing.TB, host string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
