package tools

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func call(t *testing.T, env Env, name, args string) (string, error) {
	t.Helper()
	return Filter(Builtin(env), nil, nil).Call(context.Background(), name, json.RawMessage(args))
}

func TestWebFetchReturnsTextAndFollowsTheNetworkPolicy(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/page":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Write([]byte(`<html><head><title>T</title><style>p{}</style></head><body><script>alert(1)</script><h1>Status</h1><p>All &amp; well</p><ul><li>one</li><li>two</li></ul></body></html>`))
		case "/big":
			w.Write([]byte(strings.Repeat("a", 3*WebFetchMaxText)))
		case "/moved":
			http.Redirect(w, r, "/page", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	env := workspace(t)
	env.Network = true

	out, err := call(t, env, "web_fetch", `{"url":"`+srv.URL+`/moved"}`)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "HTTP 200 OK") || !strings.Contains(out, "Status\nAll & well\none\ntwo") || strings.Contains(out, "alert") || strings.Contains(out, "p{}") {
		t.Errorf("page text:\n%s", out)
	}
	out, _ = call(t, env, "web_fetch", `{"url":"`+srv.URL+`/big"}`)
	if len(out) > WebFetchMaxText+200 || !strings.Contains(out, "more bytes truncated") {
		t.Errorf("a big body came back as %d bytes without a marker", len(out))
	}
	out, _ = call(t, env, "web_fetch", `{"url":"`+srv.URL+`/nothing"}`)
	if !strings.HasPrefix(out, "HTTP 404") {
		t.Errorf("404 came back as %q", out)
	}
	for _, bad := range []string{`{"url":"file:///etc/passwd"}`, `{"url":"ftp://x/"}`, `{}`} {
		if _, err := call(t, env, "web_fetch", bad); err == nil || !strings.Contains(err.Error(), "bad arguments") {
			t.Errorf("web_fetch %s: err = %v, want bad arguments", bad, err)
		}
	}
	env.Network = false
	if _, err := call(t, env, "web_fetch", `{"url":"`+srv.URL+`/page"}`); err == nil || !strings.Contains(err.Error(), "allow_network") {
		t.Errorf("without network: err = %v, want a pointer to allow_network", err)
	}
}

func TestMemoryToolsStoreSearchAndDelete(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	out, err := call(t, env, "memory_store", `{"content":"the VPN gateway is vpn-3","source":"alice"}`)
	if err != nil || !strings.HasPrefix(out, "stored memory m") {
		t.Fatalf("memory_store = %q, %v", out, err)
	}
	id := strings.TrimPrefix(out, "stored memory ")
	out, err = call(t, env, "memory_search", `{"query":"vpn gateway"}`)
	if err != nil || !strings.Contains(out, `"id":"`+id+`"`) || !strings.Contains(out, `"source":"alice"`) {
		t.Fatalf("memory_search = %q, %v", out, err)
	}
	if out, _ := call(t, env, "memory_search", `{"query":"payroll"}`); out != "[]" {
		t.Errorf("a search without matches = %q, want []", out)
	}
	if _, err := call(t, env, "memory_delete", `{"id":"`+id+`"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := call(t, env, "memory_delete", `{"id":"`+id+`"}`); err == nil {
		t.Error("deleting twice succeeded")
	}
	if _, err := call(t, env, "memory_search", `{"query":""}`); err == nil {
		t.Error("an empty query was accepted")
	}
}

func TestNotesAndSoul(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	if out, _ := call(t, env, "memory_read", `{}`); out != "(MEMORY.md is empty)" {
		t.Errorf("empty memory_read = %q", out)
	}
	for _, args := range []string{`{"content":"prefers metric units"}`, `{"file":"MEMORY.md","content":"deploys on Tuesdays"}`, `{"file":"USER.md","content":"Bob runs the NOC"}`} {
		if _, err := call(t, env, "memory_note", args); err != nil {
			t.Fatal(err)
		}
	}
	mem, _ := os.ReadFile(filepath.Join(env.Workspace, "MEMORY.md"))
	if string(mem) != "- prefers metric units\n- deploys on Tuesdays\n" {
		t.Errorf("MEMORY.md = %q", mem)
	}
	if out, _ := call(t, env, "memory_read", `{"file":"USER.md"}`); out != "- Bob runs the NOC\n" {
		t.Errorf("USER.md = %q", out)
	}
	if _, err := call(t, env, "memory_note", `{"file":"USER.md","content":"# Users\nnone yet","replace":true}`); err != nil {
		t.Fatal(err)
	}
	if out, _ := call(t, env, "memory_read", `{"file":"user"}`); out != "# Users\nnone yet\n" {
		t.Errorf("replaced USER.md = %q", out)
	}
	if _, err := call(t, env, "memory_note", `{"file":"/etc/passwd","content":"x"}`); err == nil {
		t.Error("memory_note wrote outside MEMORY.md and USER.md")
	}
	if _, err := call(t, env, "memory_note", `{"content":"`+strings.Repeat("x", NoteFileLimit)+`"}`); err == nil {
		t.Error("memory_note grew MEMORY.md past its limit")
	}

	if _, err := call(t, env, "soul_edit", `{"content":"# Nova\n\nYou are terse."}`); err != nil {
		t.Fatal(err)
	}
	if out, _ := call(t, env, "soul_read", `{}`); out != "# Nova\n\nYou are terse.\n" {
		t.Errorf("soul_read = %q", out)
	}
	if _, err := call(t, env, "soul_edit", `{"content":"  "}`); err == nil {
		t.Error("soul_edit blanked SOUL.md")
	}
}
