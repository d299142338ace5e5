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
