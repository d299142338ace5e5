package config_test

import (
	"reflect"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

// base is a minimal valid configuration the error cases add to.
const base = `[[agents]]
id = "coder"

[[connectors]]
id = "hook"
type = "webhook"
secret = "s"
`

func TestLoadReportsFileLineAndKeyOfEachError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{
			name:  "An unknown top-level table is reported at its header",
			files: map[string]string{"berth.toml": base + "\n[image_cfg]\nx = 1\n"},
			want:  []string{"berth.toml:9: image_cfg: unknown key (known keys: agent_defaults, agents, approvers, bindings, connectors, egress, image_config, intake, kubernetes, providers, retention, scheduler, schedules, tracing)"},
		},
		{
			name: "An unknown key under the second agent's sub-table names that agent's index",
			files: map[string]string{"berth.toml": base + `
[[agents]]
id = "ops"
[agents.container_mode]
enabled = true
netwrk = "none"
`},
			want: []string{"berth.toml:13: agents[1].container_mode.netwrk: unknown key (known keys: binds, enabled, image, memory_limit, network, runtime, security_opt, timeout_seconds, warm)"},
		},
		{
			name: "An unknown key in a drop-in names the drop-in",
			files: map[string]string{
				"berth.toml":           base,
				"berth.d/50-ops.toml":  "# ops\n[[agents]]\nid = \"coder\"\nmodle = \"x\"\n",
				"berth.d/10-fine.toml": "[scheduler]\nmax_concurrent_runs = 2\n",
			},
			want: []string{"berth.d/50-ops.toml:4: agents[0].modle: unknown key (known keys: backend, budget, container_mode, egress, file_access, id, image_config, max_iterations, mcp, model, name, provider, sandbox, tools, web_search, workspace, workspace_quota)"},
		},
		{
			name:  "A string where an integer belongs is a wrong type",
			files: map[string]string{"berth.toml": "[agent_defaults]\nmax_iterations = \"10\"\n" + base},
			want:  []string{`berth.toml:2: agent_defaults.max_iterations: must be an integer, not a string`},
		},
		{
			name:  "A value where a table belongs is a wrong type",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\ncontainer_mode = 5\n"},
			want:  []string{`berth.toml:11: agents[1].container_mode: must be a table, not an integer`},
		},
		{
			name:  "A syntax error carries the parser's line",
			files: map[string]string{"berth.toml": base + "\n[scheduler\n"},
			want:  []string{`berth.toml:9: expected '.' or ']' to end table name, but got '\n' instead`},
		},
		{
			name:  "An agent without an id is reported at its header",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nname = \"nameless\"\n"},
			want:  []string{`berth.toml:9: agents[1].id: is required`},
		},
		{
			name:  "An agent id that cannot be a path component is rejected",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"../etc\"\n"},
			want:  []string{`berth.toml:10: agents[1].id: "../etc" is not a valid id: use 1 to 63 lowercase letters, digits, '-' or '_', starting with a letter or digit`},
		},
		{
			name:  "An agent id defined twice in one file is rejected",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"coder\"\n"},
			want:  []string{`berth.toml:10: agents[1].id: agent "coder" is already defined on line 2`},
		},
		{
			name:  "A connector id with upper case letters is rejected",
			files: map[string]string{"berth.toml": base + "\n[[connectors]]\nid = \"Hook\"\ntype = \"webhook\"\nsecret = \"s\"\n"},
			want:  []string{`berth.toml:10: connectors[1].id: "Hook" is not a valid id: use 1 to 63 lowercase letters, digits, '-' or '_', starting with a letter or digit`},
		},
		{
			name:  "A provider kind outside local, openai and anthropic is rejected",
			files: map[string]string{"berth.toml": "[providers.mine]\nkind = \"gemini\"\napi_key_env = \"K\"\n" + base},
			want:  []string{`berth.toml:2: providers.mine.kind: "gemini" is not one of local, openai, anthropic`},
		},
		{
			name:  "A provider whose name is not a kind needs a kind",
			files: map[string]string{"berth.toml": "[providers.mine]\napi_key_env = \"K\"\n" + base},
			want:  []string{`berth.toml:1: providers.mine.kind: is required: one of local, openai, anthropic`},
		},
		{
			name:  "A provider key outside a provider table is one unknown key, not two errors",
			files: map[string]string{"berth.toml": "[providers]\nmodel = \"gpt-4o\"\n" + base},
			want:  []string{`berth.toml:2: providers.model: unknown key (known keys: fallback, primary; a provider is a table, [providers.model])`},
		},
		{
			name:  "A primary provider that is not defined is rejected",
			files: map[string]string{"berth.toml": "[providers]\nprimary = \"openai\"\n" + base},
			want:  []string{`berth.toml:2: providers.primary: provider "openai" is not defined (defined: local)`},
		},
		{
			name:  "A fallback provider that is not defined is reported on its own line",
			files: map[string]string{"berth.toml": "[providers]\nfallback = [\n  \"local\",\n  \"nope\",\n]\n" + base},
			want:  []string{`berth.toml:4: providers.fallback[1]: provider "nope" is not defined (defined: local)`},
		},
		{
			name:  "An agent provider that is not defined is rejected",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\nprovider = \"anthropic\"\n"},
			want:  []string{`berth.toml:11: agents[1].provider: provider "anthropic" is not defined (defined: local)`},
		},
		{
			name:  "A container network other than bridge or none is rejected",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.container_mode]\nnetwork = \"host\"\n"},
			want:  []string{`berth.toml:12: agents[1].container_mode.network: "host" would share the host's network stack (and its local services) with the agent; use "bridge" or "none"`},
		},
		{
			name:  "Joining another container's network is refused",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.container_mode]\nnetwork = \"container:abc\"\n"},
			want:  []string{`berth.toml:12: agents[1].container_mode.network: "container:abc" would join another container's network namespace; use "bridge" or "none"`},
		},
		{
			name: "Dangerous container binds are refused, each on its own line",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.container_mode]\nbinds = [\n" +
				"  \"/srv/data:/data:ro\",\n  \"/var/run/docker.sock:/var/run/docker.sock\",\n  \"/etc:/host-etc:ro\",\n" +
				"  \"/:/host\",\n  \"/proc/1:/p\",\n  \"/sys:/sys\",\n  \"/dev/sda:/dev/sda\",\n  \"/run/secrets:/s\",\n  \"/srv:/workspace\",\n  \"rel:/x\",\n]\n"},
			want: []string{
				`berth.toml:14: agents[1].container_mode.binds[1]: "/var/run/docker.sock:/var/run/docker.sock": the Docker socket gives root on the host; it is never mounted`,
				`berth.toml:15: agents[1].container_mode.binds[2]: "/etc:/host-etc:ro": sources under /etc are refused (host configuration, kernel or runtime state)`,
				`berth.toml:16: agents[1].container_mode.binds[3]: "/:/host": binding the host's root directory is refused`,
				`berth.toml:17: agents[1].container_mode.binds[4]: "/proc/1:/p": sources under /proc are refused (host configuration, kernel or runtime state)`,
				`berth.toml:18: agents[1].container_mode.binds[5]: "/sys:/sys": sources under /sys are refused (host configuration, kernel or runtime state)`,
				`berth.toml:19: agents[1].container_mode.binds[6]: "/dev/sda:/dev/sda": sources under /dev are refused (host configuration, kernel or runtime state)`,
				`berth.toml:20: agents[1].container_mode.binds[7]: "/run/secrets:/s": sources under /run are refused (host configuration, kernel or runtime state)`,
				`berth.toml:21: agents[1].container_mode.binds[8]: "/srv:/workspace": destination /workspace is managed by berth`,
				`berth.toml:22: agents[1].container_mode.binds[9]: "rel:/x": source and destination must be absolute paths`,
			},
		},
		{
			name:  "Unconfined seccomp and apparmor are refused",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.container_mode]\nsecurity_opt = [\"seccomp=unconfined\", \"apparmor:unconfined\", \"apparmor=berth-agent\"]\n"},
			want: []string{
				`berth.toml:12: agents[1].container_mode.security_opt[0]: "seccomp=unconfined" switches off the kernel's seccomp filter; refused`,
				`berth.toml:12: agents[1].container_mode.security_opt[1]: "apparmor:unconfined" switches off the kernel's apparmor filter; refused`,
			},
		},
		{
			name:  "A warm pool beyond the cap and a malformed runtime are refused",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.container_mode]\nwarm = 17\nruntime = \"run c\"\n"},
			want: []string{
				`berth.toml:12: agents[1].container_mode.warm: must be between 0 and 16, not 17`,
				`berth.toml:13: agents[1].container_mode.runtime: "run c" is not a runtime name (runc, runsc, kata-runtime, sysbox-runc, ...)`,
			},
		},
		{
			name:  "A bad value in an inline table is reported on the inline table's line",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\ncontainer_mode = { image = \"x\", memory_limit = \"lots\" }\n"},
			want:  []string{`berth.toml:11: agents[1].container_mode.memory_limit: invalid memory limit "lots": want a number with an optional unit b, k, m or g, like 512m`},
		},
		{
			name:  "A zero timeout is rejected",
			files: map[string]string{"berth.toml": "[agent_defaults.container_mode]\ntimeout_seconds = 0\n" + base},
			want:  []string{`berth.toml:2: agent_defaults.container_mode.timeout_seconds: must be a number of seconds greater than 0, not 0`},
		},
		{
			name:  "Max iterations above 1000 are rejected",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\nmax_iterations = 1001\n"},
			want:  []string{`berth.toml:11: agents[1].max_iterations: must be between 1 and 1000, not 1001`},
		},
		{
			name:  "Zero concurrent runs are rejected",
			files: map[string]string{"berth.toml": base + "\n[scheduler]\nmax_concurrent_runs = 0\n"},
			want:  []string{`berth.toml:10: scheduler.max_concurrent_runs: must be at least 1, not 0`},
		},
		{
			name:  "Agents running as root are rejected",
			files: map[string]string{"berth.toml": base + "\n[scheduler]\nrun_as = \"root\"\n"},
			want:  []string{`berth.toml:10: scheduler.run_as: agents must not run as root`},
		},
		{
			name:  "A connector type other than webhook is rejected",
			files: map[string]string{"berth.toml": base + "\n[[connectors]]\nid = \"irc\"\ntype = \"irc\"\n"},
			want:  []string{`berth.toml:11: connectors[1].type: "irc" is not one of webhook, meepachat, discord, slack`},
		},
		{
			name:  "A connector without a type is rejected at its header",
			files: map[string]string{"berth.toml": base + "\n[[connectors]]\nid = \"two\"\nsecret = \"s\"\n"},
			want:  []string{`berth.toml:9: connectors[1].type: is required: one of webhook, meepachat, discord, slack`},
		},
		{
			name:  "A webhook connector without a secret is rejected",
			files: map[string]string{"berth.toml": base + "\n[[connectors]]\nid = \"two\"\ntype = \"webhook\"\n"},
			want:  []string{`berth.toml:9: connectors[1].secret: a webhook connector needs secret or secret_file`},
		},
		{
			name: "A secret_file added by a drop-in to a connector with a secret is rejected",
			files: map[string]string{
				"berth.toml":           base,
				"berth.d/10-hook.toml": "[[connectors]]\nid = \"hook\"\nsecret_file = \"/etc/berth/hook.secret\"\n",
			},
			want: []string{`berth.d/10-hook.toml:3: connectors[0].secret_file: set either secret or secret_file, not both (secret is set at TMP/berth.toml:7)`},
		},
		{
			name:  "A reply URL that is not http(s) is rejected",
			files: map[string]string{"berth.toml": base + "reply_url = \"/relative\"\n"},
			want:  []string{`berth.toml:8: connectors[0].reply_url: "/relative" is not an absolute http(s) URL`},
		},
		{
			name:  "A connector default agent that is not defined is rejected",
			files: map[string]string{"berth.toml": base + "default_agent = \"ghost\"\n"},
			want:  []string{`berth.toml:8: connectors[0].default_agent: agent "ghost" is not defined (defined: coder)`},
		},
		{
			name:  "A binding to an agent that is not defined is rejected",
			files: map[string]string{"berth.toml": base + "\n[[bindings]]\nchannel_id = \"C1\"\nagent = \"ghost\"\n"},
			want:  []string{`berth.toml:11: bindings[0].agent: agent "ghost" is not defined (defined: coder)`},
		},
		{
			name:  "A binding to a connector that is not defined is rejected",
			files: map[string]string{"berth.toml": base + "\n[[bindings]]\nconnector = \"slack\"\nchannel_id = \"C1\"\nagent = \"coder\"\n"},
			want:  []string{`berth.toml:10: bindings[0].connector: connector "slack" is not defined`},
		},
		{
			name:  "A binding channel name that is not a valid glob is rejected",
			files: map[string]string{"berth.toml": base + "\n[[bindings]]\nchannel_name = \"dev-[\"\nagent = \"coder\"\n"},
			want:  []string{`berth.toml:10: bindings[0].channel_name: "dev-[" is not a valid glob pattern`},
		},
		{
			name:  "A binding that names no channel and no server is rejected at its header",
			files: map[string]string{"berth.toml": base + "\n[[bindings]]\nagent = \"coder\"\n"},
			want:  []string{`berth.toml:9: bindings[0]: a binding needs channel_id, channel_name or server_id`},
		},
		{
			name:  "An empty server id in a binding is rejected",
			files: map[string]string{"berth.toml": base + "\n[[bindings]]\nserver_id = \"\"\nagent = \"coder\"\n"},
			want:  []string{`berth.toml:10: bindings[0].server_id: must not be empty`},
		},
		{
			name:  "An intake default agent that is not defined is rejected",
			files: map[string]string{"berth.toml": "[intake]\ndefault_agent = \"ghost\"\n" + base},
			want:  []string{`berth.toml:2: intake.default_agent: agent "ghost" is not defined (defined: coder)`},
		},
		{
			name:  "A relative file access path is reported on its own line",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.file_access]\nallow_read = [\n  \"/etc\",\n  \"srv/data\",\n]\n"},
			want:  []string{`berth.toml:14: agents[1].file_access.allow_read[1]: "srv/data" is not an absolute path`},
		},
		{
			name: "Every error of a load is reported, ordered by file and line",
			files: map[string]string{
				"berth.toml":         base + "\n[scheduler]\nrun_as = \"root\"\nmax_concurrent_runs = \"4\"\n\n[intake]\nlisten = 8080\n",
				"berth.d/10-a.toml":  "[[agents]]\nid = \"coder\"\n[agents.container_mode]\nnetwork = \"host\"\n",
				"berth.d/20-b.toml":  "[[bindings]]\nchannel_id = \"C\"\nagent = \"nobody\"\n",
				"berth.d/30-c.toml":  "nonsense = = 1\n",
				"berth.d/40-ok.toml": "",
			},
			want: []string{
				`berth.toml:10: scheduler.run_as: agents must not run as root`,
				`berth.toml:11: scheduler.max_concurrent_runs: must be an integer, not a string`,
				`berth.toml:14: intake.listen: must be a string, not an integer`,
				`berth.d/10-a.toml:4: agents[0].container_mode.network: "host" would share the host's network stack (and its local services) with the agent; use "bridge" or "none"`,
				`berth.d/20-b.toml:3: bindings[0].agent: agent "nobody" is not defined (defined: coder)`,
				`berth.d/30-c.toml:1: expected value but found '=' instead`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, tc.files)

			_, err := config.Load(path)
			if err == nil {
				t.Fatalf("Load succeeded, want errors %q", tc.want)
			}
			got := errorLines(t, err, path)
			for i := range got {
				got[i] = replaceDir(got[i], path)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Load errors:\n%s\nwant:\n%s", join(got), join(tc.want))
			}
		})
	}
}
