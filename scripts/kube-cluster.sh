#!/usr/bin/env bash
# A real single-node Kubernetes for berth's tests (issue 23), on this machine
# only: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a
# kubelet over a containerd of its own. docs/dev/kubernetes.md tells the story.
#
#   scripts/kube-cluster.sh build    build (or reuse) the cached binaries
#   scripts/kube-cluster.sh up       start the cluster (idempotent); builds first
#   scripts/kube-cluster.sh env      print KUBECONFIG=... (nothing else on stdout)
#   scripts/kube-cluster.sh status   say whether it is up
#   scripts/kube-cluster.sh down     stop it and leave the host as it was
#   scripts/kube-cluster.sh check    up, down, and compare links, mounts, sysctls
#   scripts/kube-cluster.sh pause    rebuild the pause image and load it into the
#                                    running cluster (pods made after run it)
#
# Pods reach nothing but this machine's bridge address (KUBE_BRIDGE_IP): the
# CNI bridge has no masquerade and pods get no default route.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/lib.sh

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.0
GO_VERSION=$(go env GOVERSION 2>/dev/null || echo unknown)
CACHE_BASE=${BERTH_KUBE_CACHE:-/var/cache/berth/kubernetes}
BIN_DIR=$CACHE_BASE/$K8S_VERSION-$GO_VERSION/bin
RUN_DIR=/run/berth-kube              # sockets, pids, the state file
DATA_DIR=/var/lib/berth-kube         # etcd, containerd root, kubelet root, certs
LOG_DIR=$DATA_DIR/log
CONTAINERD_SOCK=$RUN_DIR/containerd/containerd.sock
KUBECONFIG_FILE=$DATA_DIR/admin.kubeconfig
KUBE_BRIDGE=berthkube0
KUBE_BRIDGE_MAC=02:be:27:4b:00:01 # locally administered
KUBE_POD_CIDR=10.231.0.0/24
KUBE_BRIDGE_IP=10.231.0.1
KUBE_SERVICE_CIDR=10.232.0.0/24
# The only host ports pods reach (at KUBE_BRIDGE_IP): a host listener for pods
# (berth's egress proxy) binds KUBE_BRIDGE_IP:<a port in this range>. Anything
# else a pod sends the host is refused (chain BERTH-KUBE-INPUT), so host
# services on wildcard addresses stay out of its reach.
KUBE_HOST_PORTS=17000:17999
INPUT_CHAIN=BERTH-KUBE-INPUT
# The node is named localhost: the API server reaches the kubelet by the node's
# hostname (kubelet refuses a loopback node IP), and localhost resolves to
# 127.0.0.1, where the kubelet listens, with no /etc/hosts edit.
KUBE_NODE_NAME=localhost
APISERVER_PORT=${BERTH_KUBE_APISERVER_PORT:-16443}
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
KUBELET_PORT=10250
CGROUP_PARENT=berth-kube  # kubelet's and the pods' cgroups live under /sys/fs/cgroup/*/berth-kube
# What kubelet (protectKernelDefaults: false) and the CNI bridge (isGateway) may set.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward)
PAUSE_IMAGE=berth.local/pause:$K8S_VERSION

log() { echo "kube-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

# ---- build -----------------------------------------------------------------

cmd_build() {
  if [ -x "$BIN_DIR/kubelet" ] && [ -f "$BIN_DIR/.complete" ]; then
    log "binaries cached in $BIN_DIR"
    return 0
  fi
  mkdir -p "$CACHE_BASE"
  local tmp
  tmp=$(mktemp -d "$CACHE_BASE/.build-XXXXXX")
  # The build cache is kept apart from the user's (3.9 GB cold) and dropped
  # after a good build: the binaries are what is kept.
  local gocache=$CACHE_BASE/.gocache
  local pkg=k8s.io/component-base/version
  local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  log "building Kubernetes $K8S_VERSION and etcd $ETCD_VERSION with $GO_VERSION into $BIN_DIR (10-20 min cold)"
  local start=$SECONDS
  (
    cd scripts/kube/build
    export GOCACHE=$gocache GOMAXPROCS=${BERTH_KUBE_BUILD_PROCS:-2} GOFLAGS=-mod=readonly CGO_ENABLED=0
    mkdir -p "$tmp/bin"
    nice -n 10 go build -p "$GOMAXPROCS" -trimpath -ldflags "$ldflags" -o "$tmp/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet
    nice -n 10 go build -p "$GOMAXPROCS" -trimpath -ldflags "-s -w" -o "$tmp/bin/etcd" go.etcd.io/etcd/server/v3
  ) || { rm -rf "$tmp"; die "build failed"; }
  touch "$tmp/bin/.complete"
  mkdir -p "$(dirname "$BIN_DIR")"
  # Rename into place: a build cut short leaves only a .build-* temp dir, never a half cache.
  if ! mv -T "$tmp/bin" "$BIN_DIR" 2>/dev/null; then
    [ -f "$BIN_DIR/.complete" ] || { rm -rf "$tmp"; die "cannot move the build into $BIN_DIR"; }
  fi
  rm -rf "$tmp"
  log "built in $((SECONDS - start)) s; dropping the build cache ($(du -sh "$gocache" 2>/dev/null | cut -f1))"
  rm -rf "$gocache"
  # Older temp dirs from interrupted builds.
  find "$CACHE_BASE" -maxdepth 1 -name '.build-*' -mmin +60 -exec rm -rf {} + 2>/dev/null || true
}

# ---- common -----------------------------------------------------------------

KUBELET_HEALTHZ_PORT=16248
CM_PORT=16257
SCHED_PORT=16259
DAEMONS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet)
PKI=$DATA_DIR/pki
CTR() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
# A host directory the cluster's programs create whatever we tell them; `up`
# records which were missing so `down` removes only those.
HOST_DIRS=(/var/lib/kubelet /var/log/containers /var/log/pods /var/lib/cni /run/netns /etc/kubernetes /usr/libexec/kubernetes /opt/containerd /opt/cni /etc/cni)

alive() { local f=$RUN_DIR/pids/$1.pid; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }

api() { # api PATH: GET on the API server as the admin; prints the body
  curl -fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT$1"
}

is_up() {
  local d
  for d in "${DAEMONS[@]}"; do alive "$d" || return 1; done
  [ -f "$KUBECONFIG_FILE" ] && api /readyz >/dev/null 2>&1
}

wait_for() { # wait_for SECONDS WHAT COMMAND...
  local limit=$1 what=$2 start=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS - start >= limit)); then
      log "$what did not happen within ${limit} s; logs in $LOG_DIR"
      return 1
    fi
    sleep 0.25
  done
  log "$what after $((SECONDS - START)) s"
}

render() { # render TEMPLATE OUT
  sed -e "s|@DATA_DIR@|$DATA_DIR|g" -e "s|@RUN_DIR@|$RUN_DIR|g" -e "s|@CONTAINERD_SOCK@|$CONTAINERD_SOCK|g" \
    -e "s|@PAUSE_IMAGE@|$PAUSE_IMAGE|g" -e "s|@KUBE_BRIDGE@|$KUBE_BRIDGE|g" -e "s|@KUBE_POD_CIDR@|$KUBE_POD_CIDR|g" \
    -e "s|@KUBE_BRIDGE_IP@|$KUBE_BRIDGE_IP|g" -e "s|@KUBELET_PORT@|$KUBELET_PORT|g" \
    -e "s|@KUBELET_HEALTHZ_PORT@|$KUBELET_HEALTHZ_PORT|g" -e "s|@CGROUP_PARENT@|$CGROUP_PARENT|g" \
    "$1" >"$2"
}

start_daemon() { # start_daemon NAME BINARY ARGS...: detached, logging to LOG_DIR/NAME.log
  local name=$1
  shift
  setsid "$@" </dev/null >>"$LOG_DIR/$name.log" 2>&1 9<&- &
  echo $! >"$RUN_DIR/pids/$name.pid"
}

# ---- certificates --------------------------------------------------------------

cert() { # cert NAME CN O SANS(comma list or "") USAGE(server|client|both)
  local name=$1 cn=$2 org=$3 sans=$4 usage=$5 ext=$PKI/$1.ext
  local eku=serverAuth
  [ "$usage" = client ] && eku=clientAuth
  [ "$usage" = both ] && eku=serverAuth,clientAuth
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$ext"
  local subj="/CN=$cn"
  [ -n "$org" ] && subj="/O=$org$subj"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/$name.key" \
    -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 30 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$ext"
}

make_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/ca.key" \
    -subj "/CN=berth-kube-ca" -days 30 -out "$PKI/ca.crt" 2>/dev/null
  local first_service_ip=${KUBE_SERVICE_CIDR%.*}.1
  cert etcd etcd "" "IP:127.0.0.1,DNS:localhost" both
  cert apiserver-etcd-client kube-apiserver-etcd-client "" "" client
  cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:$first_service_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" server
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" client
  cert admin berth-kube-admin system:masters "" client
  cert controller-manager system:kube-controller-manager "" "" client
  cert scheduler system:kube-scheduler "" "" client
  cert kubelet-client "system:node:$KUBE_NODE_NAME" system:nodes "" client
  cert kubelet "$KUBE_NODE_NAME" "" "IP:127.0.0.1,DNS:$KUBE_NODE_NAME" server
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
}

kubeconfig() { # kubeconfig FILE CERTNAME
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: berth-kube
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: berth-kube
  context:
    cluster: berth-kube
    user: $2
current-context: berth-kube
KC
}

# ---- the pause image -----------------------------------------------------------

# pause_binary prints the path of the pause binary, built when its source
# changed: it is cached by the hash of its source (and Go's version), apart
# from the Kubernetes binaries, so a fix to it is never hidden by their cache.
pause_binary() {
  local src=scripts/kube/build/pause sum bin
  sum=$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-16)
  bin=$CACHE_BASE/pause-$sum-$GO_VERSION/pause
  if [ ! -x "$bin" ]; then
    mkdir -p "$(dirname "$bin")"
    (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$bin.tmp" .) || die "cannot build pause"
    mv "$bin.tmp" "$bin"
  fi
  echo "$bin"
}

# A docker-archive tar (manifest.json, config, one layer holding /pause) that
# ctr imports as the sandbox image: no registry is reachable here.
pause_archive() { # pause_archive OUT.tar
  local dir bin
  bin=$(pause_binary)
  dir=$(mktemp -d)
  mkdir -p "$dir/rootfs"
  cp "$bin" "$dir/rootfs/pause"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir/rootfs" -cf "$dir/layer.tar" pause
  local diff
  diff=$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)
  cat >"$dir/config.json" <<CFG
{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:$diff"]}}
CFG
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$PAUSE_IMAGE" >"$dir/manifest.json"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir" -cf "$1" manifest.json config.json layer.tar
  rm -rf "$dir"
}

# ---- the host record (what down restores and check compares) -------------------

host_snapshot() { # host_snapshot DIR: what a cluster may change on the host
  mkdir -p "$1"
  ip -o link show | sed -E 's/^[0-9]+: //; s/[:@].*//' | sort >"$1/links"
  ip -o -4 addr show | awk '{print $2, $4}' | sort >"$1/addrs"
  ip route show table all | sort >"$1/routes"
  awk '{print $5}' /proc/self/mountinfo | sort >"$1/mounts"
  sysctl "${SYSCTLS[@]}" >"$1/sysctls" 2>/dev/null || true
  local t
  for t in filter nat mangle; do iptables -t "$t" -S 2>/dev/null | { grep '^-N' || true; } | sed "s/^/$t /"; done | sort >"$1/chains"
  local d
  for d in "${HOST_DIRS[@]}"; do [ -e "$d" ] && echo "$d"; done >"$1/dirs"
  ls /run/netns 2>/dev/null | sort >"$1/netns" || true
  find /sys/fs/cgroup -maxdepth 2 -name "$CGROUP_PARENT" 2>/dev/null | sort >"$1/cgroups"
  touch "$1/.complete"
}

need_packages() {
  ensure_packages containerd:containerd ctr:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins /usr/lib/cni/host-local:containernetworking-plugins /bin/busybox:busybox-static openssl:openssl jq:jq curl:curl /bin/ip:iproute2 iptables:iptables flock:util-linux
}

# ---- up ------------------------------------------------------------------------

cmd_up() {
  exec 9<"$0"
  flock 9
  if is_up; then
    log "already up (KUBECONFIG=$KUBECONFIG_FILE)"
    return 0
  fi
  if [ -d "$RUN_DIR" ] || [ -d "$DATA_DIR" ]; then
    log "a cluster that is not fully up is left: taking it down first"
    do_down
  fi
  need_packages
  cmd_build
  START=$SECONDS
  mkdir -p "$RUN_DIR/pids" "$LOG_DIR" "$DATA_DIR/cni/net.d" "$DATA_DIR/flexvolume" "$DATA_DIR/pod-logs"
  chmod 700 "$RUN_DIR" "$DATA_DIR"
  host_snapshot "$RUN_DIR/before"

  make_pki
  kubeconfig "$KUBECONFIG_FILE" admin
  kubeconfig "$DATA_DIR/controller-manager.kubeconfig" controller-manager
  kubeconfig "$DATA_DIR/scheduler.kubeconfig" scheduler
  kubeconfig "$DATA_DIR/kubelet.kubeconfig" kubelet-client

  # The pod bridge exists before any pod, so a host listener (berth's egress
  # proxy) can bind KUBE_BRIDGE_IP at once; the CNI bridge plugin adopts it.
  # Its MAC is fixed: a bridge left to itself takes the lowest MAC of its
  # ports, so it changes as pods come and go, and a pod that cached the old
  # one sends to nobody until its neighbour entry expires (15-45 s of
  # unanswered SYNs: the flake of runs that outlived the probe pod).
  ip link add "$KUBE_BRIDGE" address "$KUBE_BRIDGE_MAC" type bridge
  ip addr add "$KUBE_BRIDGE_IP/${KUBE_POD_CIDR#*/}" dev "$KUBE_BRIDGE"
  ip link set "$KUBE_BRIDGE" up
  render scripts/kube/cni.conflist "$DATA_DIR/cni/net.d/10-berth-kube.conflist"
  iptables -N "$INPUT_CHAIN"
  iptables -A "$INPUT_CHAIN" -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
  iptables -A "$INPUT_CHAIN" -p tcp -d "$KUBE_BRIDGE_IP" --dport "$KUBE_HOST_PORTS" -j ACCEPT
  iptables -A "$INPUT_CHAIN" -p tcp -j REJECT --reject-with tcp-reset
  iptables -A "$INPUT_CHAIN" -j REJECT --reject-with icmp-admin-prohibited
  iptables -I INPUT -i "$KUBE_BRIDGE" -j "$INPUT_CHAIN"

  # kubelet's cgroup root, one per v1 hierarchy (kubelet wants it to exist).
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h" ] && [ ! -L "${h%/}" ] && mkdir -p "$h$CGROUP_PARENT" 2>/dev/null || true
  done

  render scripts/kube/containerd.toml "$DATA_DIR/containerd.toml"
  mkdir -p "$(dirname "$CONTAINERD_SOCK")"
  start_daemon containerd containerd --config "$DATA_DIR/containerd.toml"

  start_daemon etcd "$BIN_DIR/etcd" --name berth-kube --data-dir "$DATA_DIR/etcd" \
    --listen-client-urls "https://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "https://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "berth-kube=http://127.0.0.1:$ETCD_PEER_PORT" \
    --cert-file "$PKI/etcd.crt" --key-file "$PKI/etcd.key" --client-cert-auth --trusted-ca-file "$PKI/ca.crt" \
    --unsafe-no-fsync --log-level warn

  wait_for 30 "containerd answers" CTR version
  load_pause

  start_daemon kube-apiserver "$BIN_DIR/kube-apiserver" \
    --bind-address 127.0.0.1 --secure-port "$APISERVER_PORT" --advertise-address 127.0.0.1 \
    --endpoint-reconciler-type none --service-cluster-ip-range "$KUBE_SERVICE_CIDR" \
    --etcd-servers "https://127.0.0.1:$ETCD_CLIENT_PORT" --etcd-cafile "$PKI/ca.crt" \
    --etcd-certfile "$PKI/apiserver-etcd-client.crt" --etcd-keyfile "$PKI/apiserver-etcd-client.key" \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types Hostname \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction --allow-privileged=false --profiling=false \
    --cert-dir "$DATA_DIR/apiserver-certs" --v 1
  wait_for 60 "the API server is ready" api /readyz

  start_daemon kube-controller-manager "$BIN_DIR/kube-controller-manager" \
    --kubeconfig "$DATA_DIR/controller-manager.kubeconfig" --bind-address 127.0.0.1 --secure-port "$CM_PORT" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" --use-service-account-credentials \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$KUBE_SERVICE_CIDR" --leader-elect=false \
    --flex-volume-plugin-dir "$DATA_DIR/flexvolume" --cert-dir "$DATA_DIR/controller-manager-certs" --v 1
  start_daemon kube-scheduler "$BIN_DIR/kube-scheduler" \
    --kubeconfig "$DATA_DIR/scheduler.kubeconfig" --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" \
    --leader-elect=false --cert-dir "$DATA_DIR/scheduler-certs" --v 1

  render scripts/kube/kubelet.yaml "$DATA_DIR/kubelet.yaml"
  start_daemon kubelet "$BIN_DIR/kubelet" --config "$DATA_DIR/kubelet.yaml" \
    --kubeconfig "$DATA_DIR/kubelet.kubeconfig" --root-dir "$DATA_DIR/kubelet" \
    --cert-dir "$DATA_DIR/kubelet-certs" --hostname-override "$KUBE_NODE_NAME" --v 1

  wait_for 90 "the node is Ready" node_ready
  wait_for 60 "the default service account exists" api /api/v1/namespaces/default/serviceaccounts/default
  log "up in $((SECONDS - START)) s: KUBECONFIG=$KUBECONFIG_FILE, pods in $KUBE_POD_CIDR reach the host at $KUBE_BRIDGE_IP, tcp ports $KUBE_HOST_PORTS only"
}

node_ready() {
  api "/api/v1/nodes/$KUBE_NODE_NAME" | jq -e '.status.conditions[] | select(.type == "Ready" and .status == "True")'
}

# ---- down ----------------------------------------------------------------------

cmd_down() {
  exec 9<"$0"
  flock 9
  if [ ! -d "$RUN_DIR" ] && [ ! -d "$DATA_DIR" ]; then
    log "not up"
    return 0
  fi
  do_down
  log "down"
}

stop_pid() { # stop_pid NAME: SIGTERM, then SIGKILL after 10 s
  local f=$RUN_DIR/pids/$1.pid pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# Pids in our cgroups (pods' processes) and the shims our containerd started
# (found by its socket, which no other containerd uses).
our_pids() {
  find /sys/fs/cgroup/*/"$CGROUP_PARENT" -name cgroup.procs -exec cat {} + 2>/dev/null
  local p
  for p in /proc/[0-9]*; do
    { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "-address $CONTAINERD_SOCK " && echo "${p#/proc/}"
  done
  true
}

do_down() {
  local netns=() id
  stop_pid kubelet
  if alive containerd; then
    # Each task killed and deleted through containerd, so its shim exits and
    # cleans its socket; the sandboxes' network namespaces are noted for below.
    for id in $(CTR containers ls -q 2>/dev/null); do
      netns+=($(CTR containers info "$id" 2>/dev/null | jq -r '.Spec.linux.namespaces[]? | select(.type == "network") | .path // empty' || true))
      CTR tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $(CTR containers ls -q 2>/dev/null); do
      timeout 20 ctr --address "$CONTAINERD_SOCK" --namespace k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
      CTR containers rm "$id" >/dev/null 2>&1 || true
    done
  fi
  local d
  for d in kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do stop_pid "$d"; done
  local pids i
  for ((i = 0; i < 20; i++)); do
    pids=$(our_pids | sort -u)
    [ -n "$pids" ] || break
    kill -KILL $pids 2>/dev/null || true
    sleep 0.25
  done

  # Network namespaces: those the sandboxes named, and any cni-* that was not
  # there before up (a sandbox containerd no longer listed).
  local before=$RUN_DIR/before
  if [ -d /run/netns ]; then
    for d in /run/netns/cni-*; do
      [ -e "$d" ] || continue
      grep -qxF "${d##*/}" "$before/netns" 2>/dev/null || netns+=("$d")
    done
  fi
  # Mounts under our dirs and the namespaces, deepest first.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
    awk '{print $5}' /proc/self/mountinfo | grep -E "^($RUN_DIR|$DATA_DIR)(/|$)" | sort -r
    for d in "${netns[@]}"; do grep -qxF "$d" <(awk '{print $5}' /proc/self/mountinfo) && echo "$d"; done
  )
  for d in "${netns[@]}"; do rm -f "$d"; done

  # The bridge (and any veth still on it).
  if ip link show "$KUBE_BRIDGE" >/dev/null 2>&1; then
    for d in $(ip -o link show master "$KUBE_BRIDGE" | sed -E 's/^[0-9]+: //; s/[:@].*//'); do ip link del "$d" 2>/dev/null || true; done
    ip link del "$KUBE_BRIDGE"
  fi

  if iptables -S "$INPUT_CHAIN" >/dev/null 2>&1; then
    while iptables -D INPUT -i "$KUBE_BRIDGE" -j "$INPUT_CHAIN" 2>/dev/null; do :; done
    iptables -F "$INPUT_CHAIN" && iptables -X "$INPUT_CHAIN"
  fi

  # Our cgroups, deepest first (empty by now).
  find /sys/fs/cgroup/*/"$CGROUP_PARENT" -depth -type d -exec rmdir {} + 2>/dev/null || true

  # Only a whole record is restored from: a missing line must never read as
  # "the host had no such directory".
  if [ -f "$before/.complete" ]; then
    # The sysctls kubelet set (vm.overcommit_memory, kernel.panic, ...).
    local line key val
    while read -r line; do
      key=${line%% = *} val=${line#* = }
      [ "$(sysctl -n "$key" 2>/dev/null)" = "$val" ] || sysctl -qw "$key=$val" || log "cannot restore $key=$val"
    done <"$before/sysctls"
    # iptables chains kubelet made (KUBE-KUBELET-CANARY, KUBE-FIREWALL...).
    local t c
    local now
    now=$(mktemp)
    for t in filter nat mangle; do iptables -t "$t" -S 2>/dev/null | { grep '^-N' || true; } | sed "s/^/$t /"; done | sort >"$now"
    while read -r t _ c; do
      iptables -t "$t" -S 2>/dev/null | { grep -E -- "-j $c( |$)" || true; } | sed 's/^-A/-D/' | while read -r rule; do
        eval "iptables -t $t $rule" 2>/dev/null || true
      done
      iptables -t "$t" -F "$c" 2>/dev/null || true
      iptables -t "$t" -X "$c" 2>/dev/null || true
    done < <(comm -13 "$before/chains" "$now")
    rm -f "$now"
    # Host directories kubelet and the CNI plugins create whatever they are told.
    for d in "${HOST_DIRS[@]}"; do
      if ! grep -qxF "$d" "$before/dirs"; then
        if [ "$d" = /run/netns ]; then rmdir "$d" 2>/dev/null || true; else rm -rf "$d"; fi
      fi
    done
    if [ -n "${BERTH_KUBE_KEEP_LOGS:-}" ]; then
      mkdir -p "$BERTH_KUBE_KEEP_LOGS" && cp -r "$LOG_DIR/." "$BERTH_KUBE_KEEP_LOGS/" 2>/dev/null || true
    fi
  fi
  rm -rf "$RUN_DIR" "$DATA_DIR"
}

# ---- env, status, check --------------------------------------------------------

cmd_env() {
  if ! is_up; then
    log "not up (scripts/kube-cluster.sh up)"
    return 1
  fi
  echo "KUBECONFIG=$KUBECONFIG_FILE"
}

cmd_status() {
  if is_up; then
    log "up: KUBECONFIG=$KUBECONFIG_FILE; pods in $KUBE_POD_CIDR, host listeners for pods on $KUBE_BRIDGE_IP"
    return 0
  fi
  local d
  for d in "${DAEMONS[@]}"; do alive "$d" && log "$d running" || log "$d not running"; done
  return 1
}

# check: the host is as it was after up and down (links, addresses, routes,
# mounts, the sysctls, iptables chains, host directories, netns, cgroups).
# BERTH_KUBE_CHECK_TESTS=1 runs the cluster's own tests in between.
cmd_check() {
  is_up && die "check starts from a host without the cluster: run down first"
  need_packages
  cmd_build
  local dir
  dir=$(mktemp -d)
  host_snapshot "$dir/before"
  cmd_up
  if [ "${BERTH_KUBE_CHECK_TESTS:-}" = 1 ]; then
    KUBECONFIG=$KUBECONFIG_FILE go test -count=1 -run Kubernetes ./internal/testkit/testkube/ >&2 || { cmd_down; die "the cluster's tests failed"; }
  fi
  cmd_down
  host_snapshot "$dir/after"
  if diff -r "$dir/before" "$dir/after" >&2; then
    log "check: the host is as before (links, addresses, routes, mounts, sysctls, iptables chains, dirs, netns, cgroups)"
    rm -rf "$dir"
  else
    die "check: the host differs after down (before/after in $dir)"
  fi
}

# load_pause imports the pause image into the cluster's containerd under the
# sandbox image's name; pod sandboxes made after use it, running ones keep theirs.
load_pause() {
  pause_archive "$RUN_DIR/pause.tar"
  CTR images import "$RUN_DIR/pause.tar" >/dev/null
  rm -f "$RUN_DIR/pause.tar"
}

cmd_pause() {
  is_up || die "not up (scripts/kube-cluster.sh up)"
  load_pause
  log "loaded $PAUSE_IMAGE from $(pause_binary); pods made from now on run it"
}

main() {
  local cmd=${1:-}
  case $cmd in
    build) cmd_build ;;
    up) cmd_up ;;
    down) cmd_down ;;
    env) cmd_env ;;
    status) cmd_status ;;
    check) cmd_check ;;
    pause) cmd_pause ;;
    *) echo "usage: $0 build|up|down|env|status|check|pause" >&2; exit 2 ;;
  esac
}

main "$@"
