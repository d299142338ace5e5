#!/usr/bin/env bash
# berth quickstart: builds the suite, starts it locally the way systemd would
# (private system bus using units/dbus, berth-scheduler D-Bus-activated,
# berth-intake socket-activated), posts MESSAGE signed to the webhook
# connector, prints the agent's reply and the run, then stops everything.
#
#   scripts/quickstart.sh [--keep] [--isolation container] [MESSAGE]
#
# Needs Go, dbus-daemon and systemd-socket-activate (installed when missing).
# No Docker, no LLM key: the agent runs Landlock-confined with the offline
# "local" provider. Try: scripts/quickstart.sh '/sh uname -a'
# With OPENAI_API_KEY (or ANTHROPIC_API_KEY, *_BASE_URL, *_MODEL) set, the
# demo agent talks to that model, still with no network of its own: its one
# way out is its run's egress proxy (run as user "daemon"), which adds the
# key on the way out, so the key never enters the sandbox.
# --isolation container runs it in a fresh Docker container instead: Docker
# (docker.io) and busybox-static are installed and dockerd started when
# missing, and the agent image is built offline.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_packages dbus-daemon:dbus systemd-socket-activate:systemd busctl:systemd
prev=
for arg in "$@"; do
  if [ "$arg" = --isolation=container ] || { [ "$prev" = --isolation ] && [ "$arg" = container ]; }; then
    ensure_docker
    ensure_packages :busybox-static
  fi
  prev=$arg
done
exec go run ./scripts/quickstart "$@"
