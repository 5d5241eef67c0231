# Shared by the shell tests (source it).
#   skip REASON...     prints "SKIPPED: REASON" and exits 77 (ctest's
#                      SKIP_RETURN_CODE)
#   tail_logs FILE...  the last 30 lines of each FILE there is, headed by
#                      its name
#   fail MESSAGE...    in a test that defines note (its event log),
#                      dump_logs and log_dir: notes FAIL, dumps its logs,
#                      says where they are, exits 1
#   netns_switch NS    a namespace NS holding a bridge br0 (up): the
#                      switch hosts are cabled to; appended to made_ns
#   netns_host NS SWITCH PORT ADDR
#                      a namespace NS (a host) whose eth0 is ADDR/24, its
#                      cable's other end port PORT on SWITCH's br0;
#                      appended to made_ns
#   netns_teardown     deletes every namespace in made_ns and its
#                      /etc/netns/NS (hosts files)
#   need_netns TAG     skips unless this shell may make network namespaces
#                      with a bridge and a veth pair inside (root and
#                      iproute2); TAG (a few letters) names the probe
#   stop_pids PID...   SIGTERM to each, up to 2 s for each to exit, then
#                      SIGKILL; waits for them (those this shell started)
stop_pids() {
  local p
  for p in "$@"; do kill -TERM "$p" 2> /dev/null || true; done
  for p in "$@"; do
    for _ in $(seq 20); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2> /dev/null || true
    wait "$p" 2> /dev/null || true
  done
}

skip() {
  echo "SKIPPED: $*"
  exit 77
}

need_netns() {
  [[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces (running as uid $(id -u))"
  command -v ip > /dev/null ||
    skip "the ip command is missing: install the Debian package iproute2"
  local probe="$1$$probe" err ok=1
  if ! err=$(ip netns add "$probe" 2>&1); then
    skip "'ip netns add' failed: ${err//$'\n'/ }"
  fi
  err=$( { ip -n "$probe" link set lo up &&
           ip -n "$probe" link add tthbr type bridge &&
           ip -n "$probe" link add tthv0 type veth peer name tthv1; } 2>&1) ||
    ok=0
  ip netns del "$probe" 2> /dev/null || true
  [[ $ok -eq 1 ]] ||
    skip "cannot create a bridge and a veth pair in a namespace: ${err//$'\n'/ }"
}

tail_logs() {
  local f
  for f in "$@"; do
    [[ -f $f ]] || continue
    echo "--- tail of $f"
    tail -n 30 "$f" || true
  done
}

fail() {
  note "FAIL: $*"
  dump_logs
  echo "FAIL: $* (logs in $log_dir)"
  exit 1
}

netns_switch() {
  ip netns add "$1"
  made_ns+=("$1")
  ip -n "$1" link set lo up
  ip -n "$1" link add br0 type bridge
  ip -n "$1" link set br0 up
}

netns_host() {
  local ns=$1 sw=$2 port=$3 addr=$4
  ip netns add "$ns"
  made_ns+=("$ns")
  ip -n "$ns" link set lo up
  ip -n "$ns" link add eth0 type veth peer name "$port" netns "$sw"
  ip -n "$sw" link set "$port" master br0
  ip -n "$sw" link set "$port" up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
}

netns_teardown() {
  local ns
  for ns in "${made_ns[@]}"; do
    ip netns del "$ns" 2> /dev/null || true
    rm -rf "/etc/netns/$ns"
  done
}
