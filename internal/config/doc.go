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
package config
