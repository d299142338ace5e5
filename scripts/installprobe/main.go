// Command installprobe plays the chat platform inside the install test's
// container (scripts/install-test.sh): it posts signed webhook messages and
// receives the replies berth posts back; and, from the host inside the
// container's network namespace, it drives Chromium through berth's Cockpit
// page (cockpit.go); and it plays an OpenAI-compatible model that reports
// its usage (model.go).
//
//	installprobe receive --addr 127.0.0.1:9999 --dir /var/tmp/replies
//	installprobe post --url http://127.0.0.1:8470/hooks/hooks --secret-file F --channel C [--id ID] TEXT
//	installprobe wait --dir /var/tmp/replies --id ID [--timeout 60s] [--field text]
//	installprobe model --addr 127.0.0.1:9998 --answer TEXT
//	installprobe cockpit --container C --admin U --admin-password-file F --user U --user-password-file F --out DIR
package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: installprobe receive|post|wait|model|cockpit ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "receive":
		err = receive(os.Args[2:])
	case "post":
		err = post(os.Args[2:])
	case "wait":
		err = wait(os.Args[2:])
	case "model":
		err = model(os.Args[2:])
	case "cockpit":
		err = cockpit(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "installprobe:", err)
		os.Exit(1)
	}
}

func sign(secret []byte, ts string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts + "." + string(body)))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// receive stores every reply whose signature verifies as DIR/<message id>.json
// and counts it with a line in DIR/<message id>.deliveries, so a test can
// tell one delivery from two.
func receive(args []string) error {
	fs := flag.NewFlagSet("receive", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9999", "listen address")
	dir := fs.String("dir", "/var/tmp/replies", "where replies go")
	secretFile := fs.String("secret-file", "", "verify signatures with this secret")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	secret, err := readSecret(*secretFile)
	if err != nil {
		return err
	}
	return http.ListenAndServe(*addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !hmac.Equal([]byte(r.Header.Get("X-Berth-Signature")), []byte(sign(secret, r.Header.Get("X-Berth-Timestamp"), body))) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var reply struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(body, &reply); err != nil || reply.ID == "" || strings.ContainsAny(reply.ID, "/") {
			http.Error(w, "bad reply", http.StatusBadRequest)
			return
		}
		tmp := filepath.Join(*dir, "."+reply.ID)
		if err := os.WriteFile(tmp, body, 0o644); err != nil || os.Rename(tmp, filepath.Join(*dir, reply.ID+".json")) != nil {
			http.Error(w, "cannot store", http.StatusInternalServerError)
			return
		}
		if err := appendLine(filepath.Join(*dir, reply.ID+".deliveries"), string(body)); err != nil {
			http.Error(w, "cannot count", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}

// post sends one signed message and prints the id intake answered with.
func post(args []string) error {
	fs := flag.NewFlagSet("post", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8470/hooks/hooks", "webhook URL")
	secretFile := fs.String("secret-file", "", "connector secret")
	channel := fs.String("channel", "C1", "channel id")
	id := fs.String("id", "", "message id")
	if err := fs.Parse(args); err != nil {
		return err
	}
	secret, err := readSecret(*secretFile)
	if err != nil {
		return err
	}
	msg := map[string]string{"channel": *channel, "author": "install-test", "text": strings.Join(fs.Args(), " ")}
	if *id != "" {
		msg["id"] = *id
	}
	body, _ := json.Marshal(msg)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req, err := http.NewRequest("POST", *url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Berth-Timestamp", ts)
	req.Header.Set("X-Berth-Signature", sign(secret, ts, body))
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("POST %s: %s: %s", *url, resp.Status, out)
	}
	var answer struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(out, &answer); err != nil {
		return fmt.Errorf("cannot decode answer %q: %w", out, err)
	}
	fmt.Println(answer.ID)
	return nil
}

// wait prints a field of the reply to message id once it has arrived.
func wait(args []string) error {
	fs := flag.NewFlagSet("wait", flag.ContinueOnError)
	dir := fs.String("dir", "/var/tmp/replies", "where replies go")
	id := fs.String("id", "", "message id")
	timeout := fs.Duration("timeout", 60*time.Second, "how long to wait")
	field := fs.String("field", "text", "reply field to print")
	if err := fs.Parse(args); err != nil {
		return err
	}
	deadline := time.Now().Add(*timeout)
	for {
		b, err := os.ReadFile(filepath.Join(*dir, *id+".json"))
		if err == nil {
			var reply map[string]any
			if err := json.Unmarshal(b, &reply); err != nil {
				return err
			}
			fmt.Println(reply[*field])
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no reply to %s within %s", *id, *timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// appendLine appends one line (newlines in line become spaces).
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(strings.ReplaceAll(line, "\n", " ") + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readSecret(path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("--secret-file is required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return bytes.TrimSpace(b), nil
}
