package config_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/schedules"
)

const scheduleBase = `
[[agents]]
id = "helper"

[[connectors]]
id     = "hooks"
type   = "webhook"
secret = "s3cret-for-tests"
`

func TestSchedulesResolveToTheJobsTheEngineFires(t *testing.T) {
	t.Parallel()
	c := load(t, scheduleBase+`
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "Mon..Fri 09:00 Europe/Berlin"
prompt      = "Summarise yesterday"
deliver_to  = { connector = "hooks", channel = "ops", thread = "t1" }
model       = "gpt-5-mini"
max_runtime = "10m"
overlap     = "wait"
active_hours = "08:00-20:00"

[[schedules]]
id          = "heartbeat"
agent       = "helper"
on_calendar = "*:0/30"
prompt_file = "HEARTBEAT.md"
deliver_to  = { connector = "hooks", channel = "ops" }
`)
	want := []schedules.Job{
		{
			ID: "standup", Agent: "helper", OnCalendar: "Mon..Fri 09:00 Europe/Berlin", Prompt: "Summarise yesterday",
			DeliverTo: schedules.Destination{Connector: "hooks", Channel: "ops", Thread: "t1"},
			Model:     "gpt-5-mini", MaxRuntime: 10 * time.Minute, Overlap: schedules.OverlapWait, ActiveHours: "08:00-20:00",
		},
		{
			ID: "heartbeat", Agent: "helper", OnCalendar: "*:0/30", PromptFile: "HEARTBEAT.md",
			DeliverTo: schedules.Destination{Connector: "hooks", Channel: "ops"}, Overlap: schedules.OverlapSkip,
		},
	}
	if !reflect.DeepEqual(c.Schedules, want) {
		t.Fatalf("Schedules =\n%+v\nwant\n%+v", c.Schedules, want)
	}
	for _, j := range c.Schedules {
		if err := j.Validate(); err != nil {
			t.Errorf("the engine refuses a loaded schedule: %v", err)
		}
	}
}

func TestADropInChangesAScheduleByItsID(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{
		"berth.toml": scheduleBase + `
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "09:00"
prompt      = "Summarise yesterday"
deliver_to  = { connector = "hooks", channel = "ops" }
`,
		"berth.d/10-later.toml": `
[[schedules]]
id          = "standup"
on_calendar = "10:00"
`,
	})
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Schedules) != 1 || c.Schedules[0].OnCalendar != "10:00" || c.Schedules[0].Prompt != "Summarise yesterday" {
		t.Fatalf("Schedules = %+v, want one, at 10:00, with its prompt", c.Schedules)
	}
}

func TestABadScheduleNamesFileLineAndKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		schedule string
		want     string
	}{
		{"Error_when_the_agent_is_not_defined", `
[[schedules]]
id          = "standup"
agent       = "gone"
on_calendar = "09:00"
prompt      = "hi"
deliver_to  = { connector = "hooks", channel = "ops" }
`, `berth.toml:12: schedules[0].agent: agent "gone" is not defined (defined: helper)`},
		{"Error_when_the_connector_is_not_defined", `
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "09:00"
prompt      = "hi"
deliver_to  = { connector = "slack", channel = "ops" }
`, `berth.toml:15: schedules[0].deliver_to.connector: connector "slack" is not defined (defined: hooks)`},
		{"Error_when_the_calendar_expression_is_wrong", `
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "Mon..Fri 25:00"
prompt      = "hi"
deliver_to  = { connector = "hooks", channel = "ops" }
`, `berth.toml:13: schedules[0].on_calendar: cannot parse calendar expression "Mon..Fri 25:00": the hour 25 is outside 0..23`},
		{"Error_when_active_hours_are_not_a_window", `
[[schedules]]
id           = "standup"
agent        = "helper"
on_calendar  = "09:00"
prompt       = "hi"
deliver_to   = { connector = "hooks", channel = "ops" }
active_hours = "9-5"
`, `berth.toml:16: schedules[0].active_hours: "9" is not a time of day HH:MM`},
		{"Error_when_the_id_is_not_a_unit_name", `
[[schedules]]
id          = "Stand Up"
agent       = "helper"
on_calendar = "09:00"
prompt      = "hi"
deliver_to  = { connector = "hooks", channel = "ops" }
`, `berth.toml:11: schedules[0].id: "Stand Up" is not a schedule id`},
		{"Error_when_both_prompt_and_prompt_file_are_set", `
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "09:00"
prompt      = "hi"
prompt_file = "HEARTBEAT.md"
deliver_to  = { connector = "hooks", channel = "ops" }
`, `berth.toml:10: schedules[0]: set exactly one of prompt and prompt_file`},
		{"Error_when_prompt_file_leaves_the_workspace", `
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "09:00"
prompt_file = "../../etc/shadow"
deliver_to  = { connector = "hooks", channel = "ops" }
`, `berth.toml:14: schedules[0].prompt_file: "../../etc/shadow" must be a relative path inside the agent's workspace`},
		{"Error_when_deliver_to_has_no_channel", `
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "09:00"
prompt      = "hi"
deliver_to  = { connector = "hooks" }
`, `schedules[0].deliver_to.channel: is required`},
		{"Error_when_overlap_is_unknown", `
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "09:00"
prompt      = "hi"
deliver_to  = { connector = "hooks", channel = "ops" }
overlap     = "queue"
`, `berth.toml:16: schedules[0].overlap: "queue" is not one of skip, wait`},
		{"Error_when_an_id_is_used_twice", `
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "09:00"
prompt      = "hi"
deliver_to  = { connector = "hooks", channel = "ops" }
[[schedules]]
id          = "standup"
agent       = "helper"
on_calendar = "10:00"
prompt      = "hi"
deliver_to  = { connector = "hooks", channel = "ops" }
`, `berth.toml:17: schedules[1].id: schedule "standup" is already defined on line 11`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": scheduleBase + tc.schedule})
			_, err := config.Load(path)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			lines := errorLines(t, err, path)
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("errors =\n%s\nwant one containing\n%s", strings.Join(lines, "\n"), tc.want)
			}
		})
	}
}
