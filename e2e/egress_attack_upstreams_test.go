package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The upstreams the adversarial suite (egress_attack_test.go) aims at. Each
// records every request it is sent, so a case can say which of them its
// marker reached: an attack that got through shows up here whatever the
// proxy answered.

// seenRequest is one request an upstream was sent.
type seenRequest struct {
	Method string
	Host   string
	URI    string
	Header http.Header
	Body   string
}

// marked says whether the request carries the marker of the case named
// name: "atk/<name>/" in its path or "attack":"<name>" in its body.
func (r seenRequest) marked(name string) bool {
	body := strings.ReplaceAll(r.Body, `\"`, `"`) // a JSON string holding the marked object
	return strings.Contains(r.URI, "atk/"+name+"/") || strings.Contains(body, `"attack":"`+name+`"`)
}

// recorder is an upstream that records what it is sent and answers 200,
// or a redirect for a path ending in /redirect.
type recorder struct {
	name string
	port int
	// redirectTo is where /…/redirect sends the client.
	redirectTo string
	// answer, when set, answers instead of the plain 200.
	answer func(w http.ResponseWriter, r *http.Request, body []byte)

	mu   sync.Mutex
	seen []seenRequest
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	rec.mu.Lock()
	rec.seen = append(rec.seen, seenRequest{Method: r.Method, Host: r.Host, URI: r.RequestURI, Header: r.Header.Clone(), Body: string(body)})
	rec.mu.Unlock()
	switch {
	case rec.answer != nil:
		rec.answer(w, r, body)
	case strings.HasSuffix(r.URL.Path, "/redirect"):
		w.Header().Set("Location", rec.redirectTo)
		w.WriteHeader(http.StatusFound)
	default:
		fmt.Fprintf(w, "%s reached %s\n", rec.name, r.URL.Path)
	}
}

// requests are the recorded requests that carry name's marker.
func (rec *recorder) requests(name string) []seenRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []seenRequest
	for _, r := range rec.seen {
		if r.marked(name) {
			out = append(out, r)
		}
	}
	return out
}

func (rec *recorder) all() []seenRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]seenRequest(nil), rec.seen...)
}

// serveRecorder serves rec on addr ("127.0.0.3:0", ":0" for every address
// of the host), with TLS when cert is set.
func serveRecorder(t *testing.T, rec *recorder, addr string, cert *tls.Certificate) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("cannot listen for upstream %s on %s: %v", rec.name, addr, err)
	}
	rec.port = ln.Addr().(*net.TCPAddr).Port
	if cert != nil {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: []string{"http/1.1"}})
	}
	srv := &http.Server{Handler: rec, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 1 << 20}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return rec
}

// attackModel answers like an OpenAI-compatible provider: "run COMMAND"
// becomes a shell tool call (long timeout: the probe takes a while), a
// tool result becomes "tool said: …". A body marked as an attack is
// answered with a plain 200, so a call that got through is recorded, not
// retried.
func attackModel(key string) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
			Attack string `json:"attack"`
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/v1/chat/completions" || json.Unmarshal(body, &req) != nil || req.Attack != "" || len(req.Messages) == 0 {
			io.WriteString(w, `{"reached":"the provider"}`)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+key {
			http.Error(w, `{"error":{"message":"wrong key"}}`, http.StatusUnauthorized)
			return
		}
		message := func(m string) string {
			return `{"id":"c","object":"chat.completion","created":1,"model":"gpt-e2e","choices":[{"index":0,"finish_reason":"stop","message":` + m + `}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
		}
		last := req.Messages[len(req.Messages)-1]
		switch {
		case last.Role == "tool":
			out := last.Content
			if len(out) > 2000 {
				out = out[:2000]
			}
			text, _ := json.Marshal("tool said: " + out)
			io.WriteString(w, message(`{"role":"assistant","content":`+string(text)+`}`))
		case strings.HasPrefix(last.Content, "run "):
			args, _ := json.Marshal(map[string]any{"command": strings.TrimPrefix(last.Content, "run "), "timeout": 280})
			call, _ := json.Marshal(string(args))
			io.WriteString(w, message(`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"shell","arguments":`+string(call)+`}}]}`))
		default:
			text, _ := json.Marshal("heard " + last.Content)
			io.WriteString(w, message(`{"role":"assistant","content":`+string(text)+`}`))
		}
	}
}

// testCA is a CA of the test's own and a leaf it signed for names (host
// names or IPs): the egress proxy trusts it through the scheduler's
// SSL_CERT_FILE, or a run through its CA bundle.
func testCA(t *testing.T, names ...string) (caPEM []byte, leaf tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth e2e upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// unixGreeter is a world-writable Unix socket under the host's /tmp that
// says hello to whoever connects: a tmux session, a private dbus-daemon.
func unixGreeter(t *testing.T) string {
	t.Helper()
	path := fmt.Sprintf("/tmp/berth-atk-%d-%s.sock", os.Getpid(), strconv.FormatInt(time.Now().UnixNano(), 36))
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("cannot listen on %s: %v", path, err)
	}
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); os.Remove(path) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "hello from the host's /tmp\n")
			c.Close()
		}
	}()
	return path
}
