package config

import (
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/calendar"
	"github.com/berth-dev/berth/internal/schedules"
)

// ScheduleSettings is one [[schedules]] entry: a prompt an agent is sent
// at the times its calendar expression names (internal/schedules fires it).
type ScheduleSettings struct {
	ID         string `toml:"id" berth:"check=scheduleID"`
	Agent      string `toml:"agent" berth:"check=nonEmpty"`
	OnCalendar string `toml:"on_calendar" berth:"check=onCalendar"`
	// Prompt, or PromptFile in the agent's workspace (read at each firing).
	Prompt     string            `toml:"prompt" berth:"check=nonEmpty"`
	PromptFile string            `toml:"prompt_file" berth:"check=promptFile"`
	DeliverTo  DeliverToSettings `toml:"deliver_to"`
	// ActiveHours is "HH:MM-HH:MM": scheduled firings outside it are skipped.
	ActiveHours string    `toml:"active_hours" berth:"check=activeHours"`
	Model       string    `toml:"model" berth:"check=nonEmpty"`
	MaxRuntime  *Duration `toml:"max_runtime" berth:"check=maxRuntime"`
	Overlap     string    `toml:"overlap" berth:"check=overlap"`
}

// DeliverToSettings is a schedule's deliver_to: where its replies go.
type DeliverToSettings struct {
	Connector string `toml:"connector" berth:"check=nonEmpty"`
	Channel   string `toml:"channel" berth:"check=nonEmpty"`
	Thread    string `toml:"thread" berth:"check=nonEmpty"`
}

// maxScheduleRuntime keeps max_runtime far from overflowing time.Duration
// and within what a run's limit takes.
const maxScheduleRuntime = Duration(7 * 24 * time.Hour)

// scheduleChecks are the value checks of [[schedules]] keys, in valueChecks.
var scheduleChecks = map[string]any{
	"scheduleID":  errorText(schedules.CheckID),
	"onCalendar":  errorText(func(s string) error { _, err := calendar.Parse(s); return err }),
	"activeHours": errorText(schedules.CheckActiveHours),
	"overlap":     oneOf(string(schedules.OverlapSkip), string(schedules.OverlapWait)),
	"promptFile": func(s string) string {
		if !filepath.IsLocal(s) {
			return fmt.Sprintf("%q must be a relative path inside the agent's workspace", s)
		}
		return ""
	},
	"maxRuntime": func(d Duration) string {
		if d < Duration(time.Second) || d > maxScheduleRuntime {
			return fmt.Sprintf("must be a length of time from 1s to %s, not %s", maxScheduleRuntime, d)
		}
		return ""
	},
}

// schedulesValues checks one file's [[schedules]]: ids set and unique.
func (c *checks) schedulesValues(entries []*entry[ScheduleSettings]) {
	seen := map[string]loc{}
	for _, e := range entries {
		l, ok := e.at["id"]
		if !ok {
			c.fail(where(e.at, e.self, "id"), "is required")
			continue
		}
		if first, dup := seen[e.v.ID]; dup {
			c.fail(l, "schedule %q is already defined on line %d", e.v.ID, first.line)
		}
		seen[e.v.ID] = l
	}
}

// schedulesMerged checks what only the merged configuration tells of each
// schedule: its agent and connector exist, its keys required together are
// there. With the keys' own checks, that is everything Job.Validate asks.
func (t *tree) schedulesMerged(c *checks) {
	connectors := map[string]bool{}
	var connectorIDs []string
	for _, e := range t.v.Connectors {
		connectors[e.v.ID] = true
		connectorIDs = append(connectorIDs, e.v.ID)
	}
	if len(connectorIDs) == 0 {
		connectorIDs = []string{"none"}
	}
	agents := map[string]bool{}
	for _, a := range t.v.Agents {
		agents[a.v.ID] = true
	}
	for _, e := range t.v.Schedules {
		s := &e.v
		for _, key := range []string{"on_calendar", "agent", "deliver_to.connector", "deliver_to.channel"} {
			if _, ok := e.at[key]; !ok {
				c.fail(where(e.at, e.self, key), "is required")
			}
		}
		if l, ok := e.at["agent"]; ok && !agents[s.Agent] {
			c.fail(l, "agent %q is not defined (defined: %s)", s.Agent, strings.Join(t.agentIDs(), ", "))
		}
		if l, ok := e.at["deliver_to.connector"]; ok && !connectors[s.DeliverTo.Connector] {
			c.fail(l, "connector %q is not defined (defined: %s)", s.DeliverTo.Connector, strings.Join(connectorIDs, ", "))
		}
		_, hasPrompt := e.at["prompt"]
		_, hasFile := e.at["prompt_file"]
		if hasPrompt == hasFile {
			c.fail(e.self, "set exactly one of prompt and prompt_file (what the agent is sent)")
		}
	}
}

// resolveSchedule is a merged, valid [[schedules]] entry as the scheduler
// fires it.
func resolveSchedule(e *entry[ScheduleSettings]) schedules.Job {
	s := e.v
	j := schedules.Job{
		ID:          s.ID,
		OnCalendar:  s.OnCalendar,
		Agent:       s.Agent,
		Prompt:      s.Prompt,
		PromptFile:  s.PromptFile,
		DeliverTo:   schedules.Destination{Connector: s.DeliverTo.Connector, Channel: s.DeliverTo.Channel, Thread: s.DeliverTo.Thread},
		ActiveHours: s.ActiveHours,
		Model:       s.Model,
		Overlap:     schedules.Overlap(first(s.Overlap, string(schedules.OverlapSkip))),
	}
	if s.MaxRuntime != nil {
		j.MaxRuntime = time.Duration(*s.MaxRuntime)
	}
	return j
}

// The tags' checks are looked up in valueChecks when a table is first
// walked, after every init.
func init() { maps.Copy(valueChecks, scheduleChecks) }
