package agent

import (
	"encoding/json"
	"log/slog"
	"net/url"
	"path"
	"regexp"
	"strings"

	"github.com/berth-dev/berth/agent/tools"
	"github.com/berth-dev/berth/internal/agentproto"
)

// progressReporter writes a run's progress events to the log
// (agentproto.LogProgress lines, docs/adr/0027-live-progress.md): one per
// tool call started, at most agentproto.MaxProgressEvents a run. What a
// chat user is shown is a summary made here from the call, never its
// arguments whole: a command's program (and its subcommand), a URL's host.
type progressReporter struct {
	log *slog.Logger
	seq int
}

func newProgressReporter(log *slog.Logger) *progressReporter {
	return &progressReporter{log: log}
}

// toolStarted reports that the tool name is being called with args.
func (p *progressReporter) toolStarted(name string, args json.RawMessage) {
	if p == nil || p.seq >= agentproto.MaxProgressEvents {
		return
	}
	p.seq++
	p.log.Info(agentproto.LogProgress, slog.Any("progress", agentproto.Progress{
		Seq:  p.seq,
		Tool: capText(tools.CleanText(name), 64),
		Text: capText(progressText(name, args), agentproto.MaxProgressText),
	}))
}

var (
	// programWord is a command's program as it may be shown: a plain name.
	programWord = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,39}$`)
	// subcommandWord is a second word shown with it (go test, git status):
	// short and lower case, the shape of a subcommand rather than of a
	// value (a token, a path, a URL).
	subcommandWord = regexp.MustCompile(`^[a-z][a-z0-9-]{0,19}$`)
	// hostName is a URL's host as it may be shown.
	hostName = regexp.MustCompile(`^[A-Za-z0-9.-]{1,253}$`)
)

// progressText is the summary of one tool call.
func progressText(name string, args json.RawMessage) string {
	switch name {
	case "shell":
		var a struct {
			Command string `json:"command"`
		}
		_ = json.Unmarshal(args, &a)
		if prog := commandSummary(a.Command); prog != "" {
			return "running `" + prog + "`"
		}
		return "running a command"
	case "web_fetch":
		var a struct {
			URL string `json:"url"`
		}
		_ = json.Unmarshal(args, &a)
		if u, err := url.Parse(strings.TrimSpace(a.URL)); err == nil && hostName.MatchString(u.Hostname()) {
			return "fetching " + strings.ToLower(u.Hostname())
		}
		return "fetching a page"
	case "web_search":
		return "searching the web"
	case "read_file", "list_dir":
		return "reading files"
	case "write_file":
		return "writing files"
	case "memory_store", "memory_note", "memory_delete":
		return "taking notes"
	case "memory_search", "memory_read", "soul_read":
		return "reading its notes"
	case "soul_edit":
		return "editing its SOUL.md"
	}
	return "using " + capText(tools.CleanText(name), 64)
}

// commandSummary is a shell command's program and, when it looks like one,
// its subcommand: "pytest", "go test". Leading variable assignments
// (FOO=secret cmd) are skipped, never shown; a program that is not a plain
// name gives "".
func commandSummary(command string) string {
	words := strings.Fields(command)
	for len(words) > 0 && strings.Contains(words[0], "=") {
		words = words[1:]
	}
	if len(words) == 0 {
		return ""
	}
	prog := path.Base(words[0])
	if !programWord.MatchString(prog) {
		return ""
	}
	if len(words) > 1 && subcommandWord.MatchString(words[1]) {
		return prog + " " + words[1]
	}
	return prog
}

// capText cuts s to at most n bytes on a character boundary.
func capText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
