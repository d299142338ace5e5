package scheduler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// What a shell in one conversation sandbox could try against another of
// the same agent (same uid, same workspace).

// A tool's background process in one sandbox cannot be signalled from
// another, nor seen through /proc; the sandbox's own tool can end what it
// started itself (the control).
func TestASandboxCannotSignalOrSeeAnotherSandboxesProcesses(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	a := succeeded(t, s, say(t, s, "A", `/sh sleep 3017 >/dev/null 2>&1 & echo $!`))
	pid := shellOut(a.Reply)
	if processGone(pid) {
		t.Fatalf("A's background process %q is not running (reply %q)", pid, a.Reply)
	}
	b := succeeded(t, s, say(t, s, "B", `/sh kill -KILL `+pid+` 2>&1; echo kill=$?; grep -l '30[1]7' /proc/[0-9]*/cmdline 2>&1; echo done`))
	out := shellOut(b.Reply)
	if b.Sandbox == a.Sandbox || !strings.Contains(out, "kill=1") || strings.Contains(out, "/cmdline\n") && !strings.Contains(out, "No such file") {
		t.Errorf("B (sandbox %s, A's %s) answered %q; want its kill refused and no /proc of A", b.Sandbox, a.Sandbox, out)
	}
	if processGone(pid) {
		t.Errorf("B's kill ended A's background process %s", pid)
	}

	own := succeeded(t, s, say(t, s, "A", `/sh sleep 3018 & kill $!; echo kill=$?`))
	if out := shellOut(own.Reply); !strings.Contains(out, "kill=0") {
		t.Errorf("the control: A's tool could not end its own background process: %q", out)
	}
}

// A tool that holds the workspace's shared-files lock forever (flock in a
// background process) makes another conversation's memory write fail
// within a bounded wait, with why, instead of hanging its run to the
// timeout; one that holds it briefly is waited for (the control).
func TestASharedFilesLockHeldForeverFailsAnotherConversationsWriteInsteadOfHangingIt(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	succeeded(t, s, say(t, s, "B", `/sh flock .berth-shared.lock sleep 2 >/dev/null 2>&1 & echo held`))
	brief := succeeded(t, s, say(t, s, "A", `/tool memory_note {"content":"after a brief hold"}`))
	if strings.Contains(brief.Reply, "lock") {
		t.Errorf("the control: a note after a 2s hold answered %q; want it written", brief.Reply)
	}

	succeeded(t, s, say(t, s, "B", `/sh flock .berth-shared.lock sleep 3600 >/dev/null 2>&1 & echo held`))
	r := finished(t, s, say(t, s, "A", `/tool memory_note {"content":"while B holds the lock"}`))
	if r.State != StateSucceeded || !strings.Contains(r.Reply, "cannot take the shared files' lock") {
		t.Errorf("a note while another sandbox holds the lock: %s %q, reply %q; want the tool's error, the run not hung", r.State, r.Error, r.Reply)
	}
}

// connectProbe asks the egress socket at its argument for a CONNECT
// without the token: it prints the answer's status line, or why not.
const connectProbe = `import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
    s.sendall(b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
    print("answer:", s.recv(200).split(b"\r\n")[0].decode())
except OSError as e:
    print("unreachable:", e.strerror)
`

// One sandbox cannot reach another's egress socket (its directory is
// masked); its own socket answers it, but refuses a request without the
// token, which only the agent holds (the control).
func TestASandboxCannotReachAnotherSandboxesEgressSocket(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	succeeded(t, s, say(t, s, "A", `/sh echo a`))
	succeeded(t, s, say(t, s, "B", `/sh echo b`))
	var socketOfA string
	s.sandboxes.mu.Lock()
	for c, sb := range s.sandboxes.byConv {
		if c.thread == "A" && sb.prep != nil && sb.prep.Plan.Egress != nil {
			socketOfA = sb.prep.Plan.Egress.SandboxSocket
		}
	}
	s.sandboxes.mu.Unlock()
	if socketOfA == "" {
		t.Fatal("A's sandbox has no egress socket")
	}
	probe := "/sh cat > /tmp/probe.py <<'END'\n" + connectProbe + "END\npython3 /tmp/probe.py " + socketOfA
	if out := lastLine(shellOut(succeeded(t, s, say(t, s, "B", probe)).Reply)); !strings.HasPrefix(out, "unreachable:") {
		t.Errorf("B's tool asked A's egress socket and got %q; want it unreachable", out)
	}
	if out := lastLine(shellOut(succeeded(t, s, say(t, s, "A", probe)).Reply)); !strings.Contains(out, "407") {
		t.Errorf("the control: A's tool asked its own socket without the token and got %q; want 407", out)
	}
}

// lastLine is the last line of a multi-line command's output (the reply
// repeats the command first).
func lastLine(out string) string {
	return out[strings.LastIndexByte(out, '\n')+1:]
}

// Conversations whose ids would collide if they were joined into one
// string (a separator inside an id, an empty part, another connector,
// another Unicode normal form) each get a sandbox of their own; the same
// conversation again gets its own back (the control).
func TestConversationsThatWouldCollideAsJoinedStringsGetSandboxesOfTheirOwn(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 8), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	convs := []struct{ connector, channel, thread string }{
		{"slack", "a/b", "c"},
		{"slack", "a", "b/c"},
		{"slack", "a/b/c", ""},
		{"slack/a", "b", "c"},
		{"discord", "a/b", "c"},
		{"slack", "caf\u00e9", "t"},  // NFC
		{"slack", "cafe\u0301", "t"}, // NFD of the same
	}
	sandboxOf := map[string]int{}
	for i, c := range convs {
		r := succeeded(t, s, submit(t, s, fmt.Sprintf("collide-%d", i), "alpha", "text", fmt.Sprintf("/sh cat /tmp/conv* 2>/dev/null; echo conv%d > /tmp/conv%d", i, i),
			"connector", c.connector, "channel", c.channel, "thread", c.thread))
		if j, ok := sandboxOf[r.Sandbox]; ok || r.Sandbox == "" {
			t.Errorf("conversation %+v ran in sandbox %q, that of %+v", c, r.Sandbox, convs[j])
		}
		if out := lastLine(shellOut(r.Reply)); strings.Contains(out, "conv") {
			t.Errorf("conversation %+v found another's file in its /tmp: %q", c, out)
		}
		sandboxOf[r.Sandbox] = i
	}
	for i, c := range convs {
		r := succeeded(t, s, submit(t, s, fmt.Sprintf("again-%d", i), "alpha", "text", "/sh cat /tmp/conv*",
			"connector", c.connector, "channel", c.channel, "thread", c.thread))
		if j, ok := sandboxOf[r.Sandbox]; !ok || j != i || strings.TrimSpace(shellOut(r.Reply)) != fmt.Sprintf("conv%d", i) {
			t.Errorf("the control: conversation %+v again ran in %q and saw %q; want its own sandbox and file", c, r.Sandbox, shellOut(r.Reply))
		}
	}
}

// A chat message larger than the kept agent's 64 KiB line buffer is one
// request line all the same, run in the conversation's sandbox, which
// then keeps serving (the control); one larger than the agent reads is
// refused with why before it is sent, and the sandbox stays the
// conversation's, its /tmp intact.
func TestAMessageLargerThanTheServedAgentsLineBufferOrItsRequestLimit(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	first := succeeded(t, s, say(t, s, "A", `/sh echo kept > /tmp/kept`))
	big := succeeded(t, s, say(t, s, "A", "/sh echo big; : "+strings.Repeat("x", 100<<10)))
	if big.Sandbox != first.Sandbox || !strings.Contains(big.Reply, "big") {
		t.Errorf("a 100 KiB message ran in %q (the conversation's is %q) and answered %.200q", big.Sandbox, first.Sandbox, big.Reply)
	}

	huge := finished(t, s, say(t, s, "A", "/sh echo huge; : "+strings.Repeat("y", 17<<20)))
	if huge.State == StateSucceeded || !strings.Contains(huge.Error, "more than the 16 MiB") {
		t.Errorf("a 17 MiB message: %s %q; want it refused as too large", huge.State, huge.Error)
	}
	next := succeeded(t, s, say(t, s, "A", `/sh cat /tmp/kept`))
	if next.Sandbox != first.Sandbox || !strings.Contains(next.Reply, "kept") {
		t.Errorf("the message after a huge one ran in %q (the conversation's was %q) and answered %q; want the sandbox kept", next.Sandbox, first.Sandbox, next.Reply)
	}
}
