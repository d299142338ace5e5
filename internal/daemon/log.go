package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"unicode"

	"github.com/coreos/go-systemd/v22/journal"
)

// SetupLogging installs the default slog logger: structured journal entries
// (fields like RUN_ID, AGENT, CONNECTOR) when stderr is connected to the
// journal, text on stderr otherwise. BERTH_LOG_LEVEL=debug turns on debug logs.
func SetupLogging(service string) *slog.Logger {
	level := slog.LevelInfo
	if strings.EqualFold(os.Getenv("BERTH_LOG_LEVEL"), "debug") {
		level = slog.LevelDebug
	}
	var h slog.Handler
	if ok, _ := journal.StderrIsJournalStream(); ok && journal.Enabled() {
		h = &JournalHandler{Identifier: service, Level: level}
	} else {
		h = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})
	}
	logger := slog.New(h).With("service", service)
	slog.SetDefault(logger)
	return logger
}

// NewTextLogger is for tests and tools: text logs to w.
func NewTextLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, nil))
}

// JournalHandler writes slog records as native journal entries, each
// attribute a field (run_id → RUN_ID), so `journalctl RUN_ID=...` finds a run.
// Every service logs the same things under the same keys — run_id, agent,
// connector, message_id, backend — so one journalctl match finds a run, an
// agent or a message in every service.
type JournalHandler struct {
	Identifier string
	Level      slog.Leveler
	// Send writes one entry (default journal.Send).
	Send  func(message string, priority journal.Priority, fields map[string]string) error
	attrs []slog.Attr
	group string
}

func (h *JournalHandler) Enabled(_ context.Context, l slog.Level) bool {
	if h.Level == nil {
		return l >= slog.LevelInfo
	}
	return l >= h.Level.Level()
}

func (h *JournalHandler) Handle(_ context.Context, r slog.Record) error {
	vars := map[string]string{"SYSLOG_IDENTIFIER": h.Identifier}
	var addAttr func(prefix string, a slog.Attr)
	addAttr = func(prefix string, a slog.Attr) {
		v := a.Value.Resolve()
		if v.Kind() == slog.KindGroup {
			for _, ga := range v.Group() {
				addAttr(prefix+a.Key+"_", ga)
			}
			return
		}
		vars[journalField(prefix+a.Key)] = v.String()
	}
	for _, a := range h.attrs {
		addAttr(h.group, a)
	}
	r.Attrs(func(a slog.Attr) bool {
		addAttr(h.group, a)
		return true
	})
	send := h.Send
	if send == nil {
		send = journal.Send
	}
	return send(r.Message, priority(r.Level), vars)
}

func (h *JournalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	n.attrs = append(append([]slog.Attr{}, h.attrs...), attrs...)
	return &n
}

func (h *JournalHandler) WithGroup(name string) slog.Handler {
	n := *h
	n.group = h.group + name + "_"
	return &n
}

func priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	default:
		return journal.PriDebug
	}
}

// journalField maps an attribute key to a valid journal field name:
// upper case letters, digits and underscores, not starting with "_".
func journalField(key string) string {
	var b strings.Builder
	for _, r := range key {
		switch {
		case r >= 'a' && r <= 'z':
			b.WriteRune(unicode.ToUpper(r))
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := strings.TrimLeft(b.String(), "_")
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		s = "F_" + s
	}
	if s == "MESSAGE" || s == "PRIORITY" {
		s = "BERTH_" + s
	}
	return s
}
