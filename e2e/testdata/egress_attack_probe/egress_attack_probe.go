// Command egress_attack_probe is the attacker of e2e/egress_attack_test.go:
// copied into a sandbox's workspace and started by the shell tool, it waits
// for the plan the test writes once the run is known, sends each case's raw
// bytes (to the in-sandbox proxy, a Unix socket, or inside a tunnel), and
// writes what came back to attack-results.json for the test to judge.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

const (
	planFile    = "attack-plan.json"
	resultsFile = "attack-results.json"
	// caseTimeout bounds each case: longer than the proxy's 10 s dial
	// timeout, so a slow refusal is still seen as the proxy's answer.
	caseTimeout = 20 * time.Second
	parallel    = 6
)

type plan struct {
	Cases []probeCase `json:"cases"`
	// Release, when set, is a file the probe waits for before it exits, so
	// the run stays in flight while another run attacks it.
	Release string `json:"release,omitempty"`
}

type probeCase struct {
	Name string `json:"name"`
	// Phase 0 cases run at once; later phases one at a time, in order.
	Phase int `json:"phase,omitempty"`
	// Dial is "tcp:ADDR" or "unix:PATH".
	Dial string `json:"dial,omitempty"`
	// Send is written first; Responses answers are read (default 1).
	Send      string `json:"send,omitempty"`
	Responses int    `json:"responses,omitempty"`
	// Tunnel: Send was a CONNECT; on a 200 the probe speaks TLS to TLSName,
	// verifying with TLSRoots ("bundle": $SSL_CERT_FILE, "run-ca": only the
	// run's CA, the bundle's last certificate, "none": no verification;
	// "plain": no TLS at all), then writes Inner and reads one answer.
	Tunnel   bool   `json:"tunnel,omitempty"`
	TLSName  string `json:"tls_name,omitempty"`
	TLSRoots string `json:"tls_roots,omitempty"`
	Inner    string `json:"inner,omitempty"`
	// InnerResponses answers are read inside the tunnel (default 1).
	InnerResponses int `json:"inner_responses,omitempty"`
	// Hold idle connections to HoldAt (a Unix socket) are opened, never
	// written to, and kept open while the case runs.
	Hold   int    `json:"hold,omitempty"`
	HoldAt string `json:"hold_at,omitempty"`
	// HoldSend is written on each held connection (a request without the
	// token, whose answer keeps the connection alive).
	HoldSend string `json:"hold_send,omitempty"`
	// CAInfo: read $SSL_CERT_FILE and describe the run's CA instead.
	CAInfo bool `json:"ca_info,omitempty"`
	// Greeting: dial and read what the server says first.
	Greeting bool `json:"greeting,omitempty"`
}

type answer struct {
	Status int    `json:"status"`
	Egress string `json:"egress,omitempty"` // the X-Berth-Egress header
	Body   string `json:"body,omitempty"`
}

type result struct {
	Name    string   `json:"name"`
	Answers []answer `json:"answers,omitempty"`
	Err     string   `json:"err,omitempty"`
	// Inside a tunnel: the handshake's error, and who issued the leaf.
	TLSErr    string  `json:"tls_err,omitempty"`
	TLSIssuer string  `json:"tls_issuer,omitempty"`
	Held      int     `json:"held,omitempty"`
	Greeting  string  `json:"greeting,omitempty"`
	CA        *caInfo `json:"ca,omitempty"`
	Seconds   float64 `json:"seconds"`
}

type caInfo struct {
	Subject       string   `json:"subject"`
	PermittedDNS  []string `json:"permitted_dns,omitempty"`
	PermittedIPs  []string `json:"permitted_ips,omitempty"`
	Critical      bool     `json:"critical"`
	LifetimeHours float64  `json:"lifetime_hours"`
}

func main() {
	p, err := waitPlan()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	results := make([]result, len(p.Cases))
	var wg sync.WaitGroup
	// A few at a time: the proxy rightly bounds the connections a run may
	// hold before they authenticate, and the cases must not starve each
	// other.
	slots := make(chan struct{}, parallel)
	for i, c := range p.Cases {
		if c.Phase == 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				slots <- struct{}{}
				defer func() { <-slots }()
				results[i] = run(c)
			}()
		}
	}
	wg.Wait()
	for phase := 1; phase < 4; phase++ {
		for i, c := range p.Cases {
			if c.Phase == phase {
				results[i] = run(c)
			}
		}
	}
	out, _ := json.MarshalIndent(results, "", " ")
	if err := os.WriteFile(resultsFile+".tmp", out, 0o644); err != nil || os.Rename(resultsFile+".tmp", resultsFile) != nil {
		fmt.Fprintln(os.Stderr, "cannot write the results:", err)
		os.Exit(1)
	}
	fmt.Printf("probe ran %d cases\n", len(results))
	if p.Release != "" {
		for deadline := time.Now().Add(4 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(p.Release); err == nil {
				return
			}
		}
		fmt.Println("never released")
	}
}

// waitPlan waits for the test's plan, which it writes once it knows the run.
func waitPlan() (plan, error) {
	var p plan
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(planFile)
		if err != nil {
			continue
		}
		return p, json.Unmarshal(b, &p)
	}
	return p, errors.New("no plan came")
}

func run(c probeCase) result {
	start := time.Now()
	r := result{Name: c.Name}
	switch {
	case c.CAInfo:
		r.CA, r.Err = readCA()
	default:
		attack(c, &r)
	}
	r.Seconds = time.Since(start).Seconds()
	return r
}

func dial(spec string) (net.Conn, error) {
	network, addr, _ := strings.Cut(spec, ":")
	return net.DialTimeout(network, addr, caseTimeout)
}

func attack(c probeCase, r *result) {
	_, holdPath, _ := strings.Cut(c.HoldAt, ":")
	for range c.Hold {
		h, err := net.DialTimeout("unix", holdPath, 2*time.Second)
		if err != nil {
			break
		}
		defer h.Close()
		if c.HoldSend != "" {
			h.SetDeadline(time.Now().Add(caseTimeout))
			io.WriteString(h, c.HoldSend)
			if _, err := readAnswer(bufio.NewReader(h), ""); err != nil {
				break
			}
		}
		r.Held++
	}
	conn, err := dial(c.Dial)
	if err != nil {
		r.Err = err.Error()
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(caseTimeout))
	if c.Greeting {
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		r.Greeting = string(buf[:n])
		if err != nil && n == 0 {
			r.Err = err.Error()
		}
		return
	}
	if _, err := io.WriteString(conn, c.Send); err != nil {
		r.Err = "write: " + err.Error()
		return
	}
	br := bufio.NewReader(conn)
	if c.Tunnel {
		a, err := readAnswer(br, http.MethodConnect)
		if err != nil {
			r.Err = err.Error()
			return
		}
		r.Answers = append(r.Answers, a)
		if a.Status != http.StatusOK {
			return
		}
		var inner io.ReadWriter = bufConn{conn, io.MultiReader(io.LimitReader(br, int64(br.Buffered())), conn)}
		if c.TLSRoots != "plain" {
			tlsConn, err := handshake(inner.(bufConn), c)
			if err != nil {
				r.TLSErr = err.Error()
				return
			}
			if chain := tlsConn.ConnectionState().PeerCertificates; len(chain) > 0 {
				r.TLSIssuer = chain[0].Issuer.CommonName
			}
			inner = tlsConn
		}
		if _, err := io.WriteString(inner, c.Inner); err != nil {
			r.Err = "write in the tunnel: " + err.Error()
			return
		}
		ibr := bufio.NewReader(inner)
		for range max(c.InnerResponses, 1) {
			a, err = readAnswer(ibr, "")
			if err != nil {
				r.Err = "in the tunnel: " + err.Error()
				return
			}
			r.Answers = append(r.Answers, a)
		}
		return
	}
	want := max(c.Responses, 1)
	for range want {
		a, err := readAnswer(br, "")
		if err != nil {
			r.Err = err.Error()
			return
		}
		r.Answers = append(r.Answers, a)
	}
}

func readAnswer(br *bufio.Reader, method string) (answer, error) {
	var req *http.Request
	if method != "" {
		req = &http.Request{Method: method}
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return answer{}, fmt.Errorf("read an answer: %w", err)
	}
	if method == http.MethodConnect && resp.StatusCode/100 == 2 {
		// The tunnel follows, not a body (ReadResponse would read one up
		// to EOF).
		return answer{Status: resp.StatusCode}, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if len(body) > 400 {
		body = body[:400]
	}
	return answer{Status: resp.StatusCode, Egress: resp.Header.Get("X-Berth-Egress"), Body: string(body)}, nil
}

// bufConn reads what the CONNECT's reader already buffered before the
// connection itself.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (b bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func handshake(conn bufConn, c probeCase) (*tls.Conn, error) {
	cfg := &tls.Config{ServerName: c.TLSName, NextProtos: []string{"http/1.1"}}
	switch c.TLSRoots {
	case "none":
		cfg.InsecureSkipVerify = true
	case "run-ca", "bundle":
		pool, err := roots(c.TLSRoots == "run-ca")
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	t := tls.Client(conn, cfg)
	return t, t.Handshake()
}

// bundleCerts are the certificates of $SSL_CERT_FILE, the run's CA last.
func bundleCerts() ([]*x509.Certificate, error) {
	b, err := os.ReadFile(os.Getenv("SSL_CERT_FILE"))
	if err != nil {
		return nil, fmt.Errorf("cannot read SSL_CERT_FILE %q: %w", os.Getenv("SSL_CERT_FILE"), err)
	}
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			certs = append(certs, c)
		}
	}
	if len(certs) == 0 {
		return nil, errors.New("SSL_CERT_FILE holds no certificate")
	}
	return certs, nil
}

func roots(runCAOnly bool) (*x509.CertPool, error) {
	certs, err := bundleCerts()
	if err != nil {
		return nil, err
	}
	if runCAOnly {
		certs = certs[len(certs)-1:]
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

func readCA() (*caInfo, string) {
	certs, err := bundleCerts()
	if err != nil {
		return nil, err.Error()
	}
	ca := certs[len(certs)-1]
	info := &caInfo{Subject: ca.Subject.CommonName, PermittedDNS: ca.PermittedDNSDomains, Critical: ca.PermittedDNSDomainsCritical,
		LifetimeHours: ca.NotAfter.Sub(ca.NotBefore).Hours()}
	for _, n := range ca.PermittedIPRanges {
		info.PermittedIPs = append(info.PermittedIPs, n.String())
	}
	return info, ""
}
