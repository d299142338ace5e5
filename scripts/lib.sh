# Shared by the scripts in this directory. Source it; do not run it.

# ensure_packages NEED:PACKAGE ... installs, with one apt-get call, the Debian
# packages whose NEED is missing, and fails unless every NEED is there after.
# NEED is a command; or an absolute path, for a package without a command of
# its own (cockpit-system's shell); or empty (":busybox-static"), when the
# package itself must be installed because another provides the same command.
# Recommends are left out: what is needed is named, so a fresh machine gets
# exactly what scripts/fresh-machine-check.sh proved sufficient.
ensure_packages() {
  local missing=() pair
  for pair in "$@"; do
    has_need "${pair%%:*}" "${pair#*:}" || [[ " ${missing[*]} " == *" ${pair#*:} "* ]] || missing+=("${pair#*:}")
  done
  ((${#missing[@]})) || return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${missing[*]}; install them (as root: apt-get install --no-install-recommends ${missing[*]})" >&2
    return 1
  fi
  echo "==> installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  local still=()
  for pair in "$@"; do
    has_need "${pair%%:*}" "${pair#*:}" || still+=("${pair%%:*} (from ${pair#*:})")
  done
  if ((${#still[@]})); then
    echo "cannot find ${still[*]} after installing it" >&2
    return 1
  fi
}

# has_need NEED PACKAGE: whether NEED (see ensure_packages) is there.
has_need() {
  case $1 in
    '') [ "$(dpkg-query -W -f '${Status}' "$2" 2>/dev/null)" = "install ok installed" ] ;;
    /*) [ -e "$1" ] ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

# docker_needs: Debian's engine. apparmor is only a Recommends of docker.io,
# but on a kernel with AppArmor enabled (Debian's) dockerd cannot start a
# container without apparmor_parser.
docker_needs=(docker:docker.io dockerd:docker.io iptables:iptables /sbin/apparmor_parser:apparmor)

# ensure_docker installs Debian's docker.io when missing and starts dockerd in
# the background when no engine answers (machines without systemd as PID 1).
ensure_docker() {
  ensure_packages "${docker_needs[@]}"
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
