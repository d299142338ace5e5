# Shared by the scripts in this directory. Source it; do not run it.

# ensure_packages CMD:PACKAGE ... installs Debian packages whose command is missing.
ensure_packages() {
  local missing=() pair cmd pkg
  for pair in "$@"; do
    cmd=${pair%%:*} pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${missing[*]}; install them (as root: apt-get install ${missing[*]})" >&2
    return 1
  fi
  echo "==> installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# ensure_docker installs Debian's docker.io when missing and starts dockerd in
# the background when no engine answers (machines without systemd as PID 1).
ensure_docker() {
  ensure_packages docker:docker.io dockerd:docker.io iptables:iptables
  if docker version >/dev/null 2>&1; then
    return 0
  fi
  echo "==> starting dockerd" >&2
  mkdir -p /var/log
  nohup dockerd >/var/log/berth-dockerd.log 2>&1 &
  local i
  for i in $(seq 1 60); do
    docker version >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "dockerd did not come up; see /var/log/berth-dockerd.log" >&2
  tail -20 /var/log/berth-dockerd.log >&2 || true
  return 1
}
