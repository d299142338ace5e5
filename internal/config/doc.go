// Package config turns /etc/berth/berth.toml and its drop-ins into one
// validated Config, and answers the questions every berth process asks of it:
// which agent handles this message (Route), with which effective settings
// (Agent), and which providers it may call (ProviderChain).
//
// Loading is strict: unknown keys, wrong types and bad values are errors that
// name the file, the line and the full key (agents[1].container_mode.network),
// and a load reports all of them at once so an admin fixes a file in one pass.
package config
