// Package config turns /etc/berth/berth.toml and its drop-ins into one
// validated Config, and answers the questions every berth process asks of it:
// which agent handles this message (RouteMessage), with which effective
// settings and image (Agent), which providers it may call (ProviderChain),
// what a connector's credentials are (Connector.Credential, CheckCredentials)
// and how long finished work is kept (Config.Retention).
//
// Loading is strict: unknown keys, wrong types and bad values are errors that
// name the file, the line and the full key (agents[1].container_mode.network),
// and a load reports all of them at once so an admin fixes a file in one pass.
// Which [[connectors]] keys are valid depends on the connector's type, which
// may come from another file, so that is checked after the merge.
//
// Connector credentials are references ("$VAR", a systemd credential name, an
// absolute path), never the secrets: a value that looks like a token written
// in clear is refused, and nothing in this package writes a resolved
// credential into an error, a log or `berthctl config check`.
//
// # One field per key
//
// Each table is one Go struct and each key one tagged field (walk.go reads the
// tags): decoding, the merge of drop-ins, the value checks and the
// file:line:key of every error all come from it. document (decode.go) is the
// whole file. A value is read once, into its type (Bytes, Duration,
// NetworkMode, UIDRange: an UnmarshalText that refuses what it cannot hold);
// what no file set is defaulted once, where the Config is resolved
// (tree.config, Config.Agent), from the constants in load.go; a Config made
// in code (a test's) starts from Defaults, the Config of an empty file, so
// nothing downstream defaults a value again. A check that
// spans keys (required, unique, one of two, a reference to another table) is
// code in validate.go, which asks where a key was set with where(at, self,
// key).
//
// To add a key: add the field with `toml:"key"`, and `berth:"check=NAME"`
// when its values are limited (a new NAME goes into valueChecks); then
// resolve it (an AgentSettings field into Agent in Config.Agent, a top-level
// one in tree.config). Settings fields are pointers or nil slices when "not
// set" must differ from the zero value, so [agent_defaults] can fill them.
// To add a table:
//
//   - [agents.sandbox] (scope, idle_stop, max_lifetime, max_per_agent; also
//     in [agent_defaults]): a SandboxSettings struct (IdleStop *Duration,
//     MaxPerAgent *int, ...) and one field `Sandbox SandboxSettings
//     toml:"sandbox"` in AgentSettings, resolved in Config.Agent.
//   - [[agents.egress.git]], [[agents.mcp]]: a []T field of a struct T
//     (`Git []GitRule toml:"git"` in EgressSettings). Its elements' keys are
//     located in the agent's fieldLocs ("egress.git[0].repo"), and a later
//     file or the agent over [agent_defaults] replaces the array whole.
//   - [[egress.github_apps]]: a field `GitHubApps []*entry[GitHubApp]
//     toml:"github_apps"` in egressSettings, each element a table with its
//     own fieldLocs (berth:"merge=id" lets a drop-in change one by its id);
//     resolved in tree.config.
//   - [[schedules]]: the same, as a field of document.
package config
