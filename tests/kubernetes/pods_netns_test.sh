#!/usr/bin/env bash
# Kubernetes.PodsInNetworkNamespaces: tools/deploy/kubernetes' pods as real
# processes, without a cluster. Each pod (the StatefulSet's 2 shards, the
# Indexed Job's 3 workers) gets a network namespace of its own with its own
# address on a bridge, and runs exactly the command, args and environment
# the manifests give it (tests/kubernetes/pods.py emit: downward-API fields
# and $(VAR) expanded as Kubernetes does; /usr/bin/tether-* is the build's
# binary; each volume mount a directory: a Secret's files in a temp dir
# shared by the pods, each shard's volume a directory of its own, emptyDirs
# per pod). Names resolve through a hosts file per namespace (`ip netns
# exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts) holding every
# shard pod's DNS names, short and FQDN, as the headless Service gives them.
# A "kubelet" (pods.py probe, in the bridge's namespace, which has an
# address of its own: the node) polls every shard's readiness and liveness
# endpoints on the pod's address and logs each change.
#
# The order is the one a cluster may well give:
#   1. shard 1 and the 3 workers start while shard 0 is not scheduled yet:
#      its name does not resolve. Shard 1's /healthz answers 200 and its
#      /readyz 503 (not registered).
#   2. shard 0 is "scheduled": its names are added to the hosts files, it
#      starts; shard 1 and the workers reach it. /readyz turns 200 on both
#      shards, training starts.
#      From the node, shard 0's port 8080 (the dashboard Service's target)
#      serves the page, and "checkpoint now" is refused with a wrong token
#      (401) and accepted with the token Secret's (202).
#   3. once a checkpoint round is complete, shard 1's pod is killed
#      (SIGKILL) and started again with the same volume and command; shard
#      0 sees it register again and has it load the round; the workers
#      redial it.
#   4. every worker exits 0, rank 0 reports a test accuracy, and shard 1's
#      /readyz is 200 again.
#   5. resume, as the README says: both shards stopped (SIGTERM, as
#      `kubectl scale --replicas 0` does), started again on their volumes
#      with TETHER_RESUME=latest, and a new set of workers (a new Job):
#      shard 0 logs that every shard loaded the latest complete round, and
#      the new workers finish the run (exit 0, rank 0's accuracy).
#
# Needs root, iproute2 and python3-yaml; without root or network namespaces
# it prints "SKIPPED: <reason>" and exits 77. Exit 0: pass; 1: fail, with
# the tail of every log.
#
# Environment:
#   TETHER_SERVER_BIN, TETHER_WORKER_BIN  the binaries (default: build/release)
#   ARTIFACT_DIR      every pod's log, probes.log (the kubelet's view),
#                     events.log, and pods/ (the emitted pod commands:
#                     POD.CONTAINER.argv and .env, NUL-separated, pods.json)
#                     (default: a new /tmp/tether-k8s-XXXXXX)
#   TETHER_K8S_DEADLINE_S  bound on the whole run, from the network's set-up
#                     to the last worker's exit (170)
#   TETHER_K8S_WORKER_EXTRA_ARGS  appended to each worker's args (the last
#                     of a flag given twice wins): "--threads 1" by default,
#                     as 5 pods share this machine's cores where the
#                     manifests give each worker 2 (OpenMP threads on cores
#                     they do not get slow training many times over); set it
#                     empty to run the workers' args exactly
set -euo pipefail
source "$(dirname "$0")/../support/lib.sh"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
server_bin=${TETHER_SERVER_BIN:-$repo/build/release/tether-server}
worker_bin=${TETHER_WORKER_BIN:-$repo/build/release/tether-worker}
deadline_s=${TETHER_K8S_DEADLINE_S:-170}
read -r -a worker_extra <<< "${TETHER_K8S_WORKER_EXTRA_ARGS---threads 1}"
python=/usr/bin/python3

# --- 1. Can this machine run it? -------------------------------------------
need_netns tk8
mkdir -p /etc/netns 2> /dev/null || skip "cannot create /etc/netns"

for b in "$server_bin" "$worker_bin"; do
  [[ -x "$b" ]] || { echo "FAIL: $b is missing or not executable (build first)"; exit 1; }
done
"$python" -c 'import yaml' 2> /dev/null ||
  { echo "FAIL: $python cannot import yaml: install python3-yaml (tools/setup)"; exit 1; }

log_dir=${ARTIFACT_DIR:-$(mktemp -d /tmp/tether-k8s-XXXXXX)}
mkdir -p "$log_dir"
rm -f "$log_dir"/*.log
events="$log_dir/events.log"
: > "$events"
work=$(mktemp -d /tmp/tether-k8s-work-XXXXXX)

t0=$(date +%s.%N)
now() { awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }'; }
note() { echo "[$(now) s] $*" | tee -a "$events"; }

# Namespaces and hosts files left by an earlier run that was SIGKILLed:
# those whose PID is gone. Only names this script makes.
while read -r name _; do
  if [[ $name =~ ^tk8([0-9]+)(br|s[0-9]+|w[0-9]+|probe)$ ]] &&
     ! kill -0 "${BASH_REMATCH[1]}" 2> /dev/null; then
    ip netns del "$name" 2> /dev/null || true
    rm -rf "/etc/netns/$name"
  fi
done < <(ip netns list 2> /dev/null)

made_ns=()
pids=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_pids "${pids[@]}"
  netns_teardown
  rmdir /etc/netns 2> /dev/null || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
nap() { sleep "$1" & wait $!; }

dump_logs() { tail_logs "$log_dir"/*.log; }

# --- 2. The pods, from the manifests -----------------------------------------
pod_files="$log_dir/pods"
rm -rf "$pod_files"
"$python" "$here/pods.py" emit --out "$pod_files" --root "$work/pods" \
  --secrets "$work/secrets" --bin "tether-server=$server_bin" \
  --bin "tether-worker=$worker_bin" > "$log_dir/pod-commands.txt" ||
  fail "pods.py emit failed"
# The Secrets (kubectl create secret generic ... --from-file=KEY=...): the
# files the pods read, with random contents; 0440 as the manifests mount them.
while read -r f; do
  mkdir -p "$work/secrets/$(dirname "$f")"
  (umask 077 && head -c 32 /dev/urandom | base64 > "$work/secrets/$f")
  chmod 0440 "$work/secrets/$f"
done < "$pod_files/secret-files"

declare -A ns_of addr_of kind_of ordinal_of names_of ready_port_of live_port_of
shards=()
workers=()
while IFS=$'\t' read -r files kind ordinal hostname subdomain namespace rport lport; do
  if [[ $kind == StatefulSet ]]; then
    short="s$ordinal"
    addr_of[$files]="10.79.0.$((1 + ordinal))"
    shards+=("$files")
    # The headless Service's records: HOST.SUBDOMAIN(.NS.svc.cluster.local).
    names_of[$files]="$hostname.$subdomain.$namespace.svc.cluster.local $hostname.$subdomain $hostname"
  else
    short="w$ordinal"
    addr_of[$files]="10.79.0.$((11 + ordinal))"
    workers+=("$files")
    names_of[$files]="$hostname"
  fi
  ns_of[$files]="tk8$$$short"
  kind_of[$files]=$kind
  ordinal_of[$files]=$ordinal
  ready_port_of[$files]=$rport
  live_port_of[$files]=$lport
done < "$pod_files/pods.tsv"
(( ${#shards[@]} == 2 && ${#workers[@]} == 3 )) ||
  fail "expected 2 shard pods and 3 worker pods in the manifests, got ${#shards[@]} and ${#workers[@]}"
shard0=${shards[0]}
shard1=${shards[1]}
note "pods: ${shards[*]} ${workers[*]}"

# --- 3. The network -------------------------------------------------------------
sw="tk8$$br"
netns_switch "$sw"
ip -n "$sw" addr add 10.79.0.254/24 dev br0   # the node: the kubelet probes from here
for p in "${shards[@]}" "${workers[@]}"; do
  ns=${ns_of[$p]}
  netns_host "$ns" "$sw" "${ns#"tk8$$"}" "${addr_of[$p]}"
  # /etc/hosts in the pod: its own name, and every shard scheduled so far
  # (shard 0 is added in step 5). No DNS server answers in the namespace.
  mkdir -p "/etc/netns/$ns"
  {
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n'
    printf '%s\t%s\n' "${addr_of[$p]}" "${names_of[$p]}"
    for s in "${shards[@]}"; do
      [[ $s == "$p" || $s == "$shard0" ]] && continue
      printf '%s\t%s\n' "${addr_of[$s]}" "${names_of[$s]}"
    done
  } > "/etc/netns/$ns/hosts"
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' > "/etc/netns/$ns/resolv.conf"
done
note "network up: bridge in $sw (node 10.79.0.254); $(for p in "${shards[@]}" "${workers[@]}"; do printf '%s=%s ' "${ns_of[$p]}" "${addr_of[$p]}"; done)"

# --- 4. Starting a pod: its command, env and working directory ----------------
die_with_us=()
command -v setpriv > /dev/null && die_with_us=(setpriv --pdeathsig KILL --)
declare -A pid_of
env_override=()
start_pod() {  # start_pod FILES LOGNAME
  local p=$1 name=$2 argv env
  mapfile -d '' -t argv < "$pod_files/$p.argv"
  mapfile -d '' -t env < "$pod_files/$p.env"
  env+=("${env_override[@]}")   # env -i: a later NAME=VALUE wins
  [[ ${kind_of[$p]} == Job ]] && argv+=("${worker_extra[@]}")
  mkdir -p "$work/pods/${p%.*}"
  # env -i: the pod's variables only (and PATH, HOSTNAME as a container has).
  (cd "$work/pods/${p%.*}" &&
   exec ip netns exec "${ns_of[$p]}" "${die_with_us[@]}" env -i \
     PATH=/usr/local/bin:/usr/bin:/bin HOSTNAME="${p%%.*}" "${env[@]}" \
     "${argv[@]}") >> "$log_dir/$name.log" 2>&1 &
  pid_of[$name]=$!
  pids+=("$!")
}
alive() { kill -0 "${pid_of[$1]}" 2> /dev/null; }
past_deadline() { awk -v t="$(now)" -v d="$deadline_s" 'BEGIN { exit !(t >= d) }'; }

# wait_for_line NAME REGEX TIMEOUT_S [OTHER...]: until NAME.log has a line
# matching REGEX; fails at once if NAME or any OTHER process exits first.
wait_for_line() {
  local name=$1 re=$2 limit=$3 waited=0 other
  shift 3
  until grep -Eq "$re" "$log_dir/$name.log" 2> /dev/null; do
    for other in "$name" "$@"; do
      alive "$other" || fail "$other exited while waiting for $name to log /$re/"
    done
    (( waited++ < limit * 10 )) || fail "$name did not log /$re/ within $limit s"
    past_deadline && fail "past the $deadline_s s deadline waiting for $name to log /$re/"
    sleep 0.1
  done
}
# wait_for_probe TARGET CODE TIMEOUT_S [AFTER_EPOCH]: until the kubelet has
# logged TARGET answering CODE (at or after AFTER_EPOCH).
probe_seen() {
  awk -v t="$1" -v c="$2" -v after="${3:-0}" \
    '$2 == t && $3 == c && $1 >= after { found = 1 } END { exit !found }' \
    "$log_dir/probes.log"
}
wait_for_probe() {
  local target=$1 code=$2 limit=$3 after=${4:-0} waited=0
  until probe_seen "$target" "$code" "$after"; do
    (( waited++ < limit * 10 )) ||
      fail "the probe of $target did not answer $code within $limit s"
    past_deadline && fail "past the $deadline_s s deadline waiting for $target to answer $code"
    sleep 0.1
  done
}

# The kubelet: every shard's probes, on the pod's address.
targets=()
for s in "${shards[@]}"; do
  n="shard${ordinal_of[$s]}"
  [[ ${ready_port_of[$s]} != - ]] ||
    fail "$s has no readiness probe in the manifests"
  [[ ${live_port_of[$s]} != - ]] ||
    fail "$s has no liveness probe in the manifests"
  targets+=("$n.readyz=http://${addr_of[$s]}:${ready_port_of[$s]}/readyz"
            "$n.healthz=http://${addr_of[$s]}:${live_port_of[$s]}/healthz")
done
: > "$log_dir/probes.log"
ip netns exec "$sw" "${die_with_us[@]}" "$python" "$here/pods.py" probe \
  --log "$log_dir/probes.log" --interval 0.1 "${targets[@]}" \
  > "$log_dir/kubelet.log" 2>&1 &
pid_of[kubelet]=$!
pids+=("$!")

# --- 5. Shard 1 and the workers first; shard 0 "scheduled" later ---------------
start_pod "$shard1" shard1
for w in "${workers[@]}"; do start_pod "$w" "worker${ordinal_of[$w]}"; done
note "started shard 1 and 3 workers (their args + '${worker_extra[*]}'); shard 0's name does not resolve yet"
wait_for_probe shard1.healthz 200 20
wait_for_probe shard1.readyz 503 5
nap 2
for w in shard1 worker0 worker1 worker2; do
  alive "$w" || fail "$w exited while shard 0's name did not resolve (it should keep trying)"
done
if probe_seen shard1.readyz 200; then fail "shard 1 said ready before shard 0 existed"; fi
note "shard 1: /healthz 200, /readyz 503 while shard 0 is missing: $(awk '$2 == "shard1.readyz" && $3 == 503 { $1 = $2 = $3 = ""; print; exit }' "$log_dir/probes.log")"

for p in "${shards[@]}" "${workers[@]}"; do
  [[ $p == "$shard0" ]] && continue
  printf '%s\t%s\n' "${addr_of[$shard0]}" "${names_of[$shard0]}" >> "/etc/netns/${ns_of[$p]}/hosts"
done
t_shard0=$(date +%s.%N)
start_pod "$shard0" shard0
note "shard 0 scheduled: its names resolve, it starts"
wait_for_line shard0 'shard 1 registered' 60 shard1
wait_for_line shard0 'all 3 workers joined; training starts' 90 \
  shard1 worker0 worker1 worker2
note "shard 1 registered; all 3 workers joined (training starts)"
wait_for_probe shard0.healthz 200 10
wait_for_probe shard0.readyz 200 10
wait_for_probe shard1.readyz 200 10
note "/readyz 200 on both shards (shard 0's dashboard port, shard 1's --health port)"

# The dashboard Service's target (shard 0's port 8080, from the node): the
# page, and "checkpoint now", which needs the token Secret's value.
node_http() { ip netns exec "$sw" "$python" "$here/pods.py" http "$@" 2>&1 || true; }
dash="http://${addr_of[$shard0]}:${ready_port_of[$shard0]}"
token_file=$(grep -m 1 -E '(^|/)token$' "$pod_files/secret-files" || true)
[[ -n $token_file ]] || fail "no dashboard token file among the Secrets' files"
page=$(node_http GET "$dash/")
[[ $page == "200 text/html"* ]] || fail "GET / on shard 0's dashboard port: $page"
wrong=$(node_http POST "$dash/api/checkpoint" --token not-the-token-0123456789)
[[ $wrong == 401* ]] || fail "POST /api/checkpoint with a wrong token: $wrong (want 401)"
right=$(node_http POST "$dash/api/checkpoint" --token-file "$work/secrets/$token_file")
[[ $right == 202* ]] || fail "POST /api/checkpoint with the Secret's token: $right (want 202)"
note "dashboard: GET / $page; checkpoint now: wrong token ${wrong%% *}, the Secret's token $right"

# --- 6. Kill shard 1's pod once a round is complete; start it again -----------
wait_for_line shard0 'checkpoint round [0-9]+ complete' 60 shard1 worker0 worker1 worker2
round=$(sed -nE 's/.*checkpoint round ([0-9]+) complete.*/\1/p' "$log_dir/shard0.log" | head -n 1)
for w in worker0 worker1 worker2; do
  alive "$w" || fail "$w had already exited when shard 1 was to be killed: not mid-run"
done
kill -KILL "${pid_of[shard1]}"
wait "${pid_of[shard1]}" 2> /dev/null || true
t_kill=$(date +%s.%N)
note "shard 1's pod killed (SIGKILL) after round $round"
nap 1   # the kubelet's restart delay
start_pod "$shard1" shard1
note "shard 1's pod started again: same volume, same command"
wait_for_line shard0 'shard 1 registered again' 60 shard0 shard1
wait_for_line shard1 'loaded checkpoint round' 60 shard0 shard1
note "shard 1 $(grep -Eo 'loaded checkpoint round [0-9]+ \(clock [0-9]+\)' "$log_dir/shard1.log" | tail -n 1)"
wait_for_probe shard1.readyz 200 30 "$t_kill"
wait_for_probe shard1.healthz 200 1 "$t_kill"
note "restarted shard 1: /healthz 200, /readyz 200 again"

# --- 7. Every worker must finish --------------------------------------------------
# wait_workers SUFFIX: until worker0SUFFIX..worker2SUFFIX have exited, each 0;
# sets acc to rank 0's final test accuracy.
wait_workers() {
  local sfx=$1 i p left=3 line
  local -A rc=()
  while (( left > 0 )); do
    for i in 0 1 2; do
      [[ -n ${rc[$i]:-} ]] && continue
      p=${pid_of[worker$i$sfx]}
      if ! kill -0 "$p" 2> /dev/null; then
        if wait "$p"; then rc[$i]=0; else rc[$i]=$?; fi
        left=$((left - 1))
        note "worker $i$sfx exited with status ${rc[$i]}"
      fi
    done
    (( left == 0 )) && break
    past_deadline && fail "workers$sfx still running after $deadline_s s"
    alive "shard0$sfx" || fail "shard 0$sfx exited while the workers were training"
    sleep 0.2
  done
  for i in 0 1 2; do
    [[ ${rc[$i]} -eq 0 ]] || fail "worker $i$sfx exited with status ${rc[$i]}"
  done
  line=$(grep -hE '^worker 0: .*test accuracy' "$log_dir/worker0$sfx.log" \
    "$log_dir/worker1$sfx.log" "$log_dir/worker2$sfx.log" | tail -n 1 || true)
  [[ -n $line ]] || fail "no worker$sfx log has rank 0's final line"
  acc=$(sed -nE 's/.* test accuracy ([0-9.]+)%.*/\1/p' <<< "$line")
  [[ -n $acc ]] || fail "rank 0's final line reports no test accuracy: $line"
  awk -v a="$acc" 'BEGIN { exit !(a >= 70) }' ||
    fail "rank 0's test accuracy $acc% (workers$sfx) is below 70%"
}
wait_workers ""
acc_run=$acc
alive shard1 || fail "the restarted shard 1 exited before the run ended"
for n in shard0 shard1; do
  probe_seen "$n.readyz" 200 || fail "$n never answered /readyz 200"
done
grep -q 'registered again' "$log_dir/shard0.log" || fail "shard 0 did not see shard 1 register again"
note "run complete: rank 0 test accuracy $acc_run%"

# --- 8. Resume, as README.md says: every shard stopped (scaled to 0), ---------
# TETHER_RESUME=latest, the shards started again on their volumes, a new Job.
last_round=$(sed -nE 's/.*checkpoint round ([0-9]+) complete.*/\1/p' "$log_dir/shard0.log" | tail -n 1)
stop_pids "${pid_of[shard0]}" "${pid_of[shard1]}"
note "shards stopped (SIGTERM); the latest complete round is $last_round"
env_override=(TETHER_RESUME=latest)
start_pod "$shard1" shard1-resumed
start_pod "$shard0" shard0-resumed
for w in "${workers[@]}"; do start_pod "$w" "worker${ordinal_of[$w]}-resumed"; done
env_override=()
wait_for_line shard0-resumed 'resumed from checkpoint round [0-9]+: every shard loaded it' 60 \
  shard1-resumed
resumed=$(grep -Eo 'resumed from checkpoint round [0-9]+' "$log_dir/shard0-resumed.log" | head -n 1)
note "shards started again with TETHER_RESUME=latest: $resumed"
[[ $resumed == "resumed from checkpoint round $last_round" ]] ||
  fail "resumed from another round than the latest complete one ($last_round)"
wait_workers -resumed
note "resumed run complete: rank 0 test accuracy $acc%"

s0_503=$(awk -v after="$t_shard0" '$2 == "shard0.readyz" && $3 == 503 && $1 >= after { n++ } END { print n + 0 }' "$log_dir/probes.log")
summary="PASS: rank 0 test accuracy ${acc_run}%; 3/3 workers exited 0; shard 1 /readyz 503 then 200 (shard 0 $( ((s0_503)) && echo "503 then 200" || echo "200 at its first answer")); shard 1 killed after round $round and restarted, loaded it; resumed with TETHER_RESUME=latest from round $last_round, 3 new workers exited 0 (${acc}%); total $(now) s; logs in $log_dir"
note "$summary" > /dev/null
echo "$summary"
