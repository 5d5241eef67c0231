#!/usr/bin/env bash
# tools/deploy/slurm/tether.sbatch under a real Slurm (Debian 12's
# slurmctld, slurmd, slurm-client and munge), not a mock: this script starts
# a private one-node cluster on this host -- its own munged, slurmctld and
# slurmd, every file under a temporary directory, on ports of their own, so
# a Slurm already on the machine is not touched -- and submits four jobs:
#
#   1. 2 shards and 3 workers (one 3x slower) training the MLP on
#      Fashion-MNIST for 2 epochs, checkpointing every 100 clocks. It must
#      end COMPLETED (sacct -c: job completion data, jobcomp/filetxt, as
#      there is no slurmdbd), print the dashboard's URL and a final test
#      accuracy of at least TETHER_SLURM_MIN_ACCURACY, and leave the run's
#      key and dashboard token with mode 600.
#   2. The same with TETHER_RESUME=latest and 3 epochs: shard 0 must say it
#      resumed from a round N > 0, the workers must train on past clock N to
#      the end of epoch 3, and the job must end COMPLETED with the accuracy.
#   3. A 50-epoch run stopped from its dashboard (POST /api/stop with the
#      token the output names; refused without it): the job must evaluate
#      and end COMPLETED.
#   4. A new run (no TETHER_RESUME) on the first run's checkpoint
#      directory: it must fail at once, saying to set TETHER_RESUME=latest.
# Job 1's dashboard URL, as printed, must answer GET /api/config.
#
# Needs root (the daemons run as root) and the Slurm and munge commands;
# otherwise, or when a daemon does not come up here, it prints
# "SKIPPED: <reason>" and exits 77 (ctest's SKIP_RETURN_CODE). Exit 0: pass;
# 1: fail, with the tails of the job outputs and the daemons' logs. Every
# daemon (and any job process) it started is stopped on exit, even on
# failure: they all carry TTH_SLURM_TEST=<its temporary directory>.
#
# Environment:
#   TETHER_BIN_DIR    where tether-server, tether-worker (and tether-ckpt)
#                     are (default: build/release under the repository root)
#   ARTIFACT_DIR      job outputs, daemon logs, slurm.conf (default: a new
#                     /tmp/tether-slurm-artifacts-XXXXXX)
#   TETHER_SLURM_MIN_ACCURACY   (default 0.80)
#   TETHER_SLURM_JOB_TIMEOUT_S  bound on each job, submit to end (default 150)
set -euo pipefail
source "$(dirname "$0")/../support/lib.sh"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
sbatch_script=$repo/tools/deploy/slurm/tether.sbatch
bin_dir=${TETHER_BIN_DIR:-$repo/build/release}
min_acc=${TETHER_SLURM_MIN_ACCURACY:-0.80}
job_timeout_s=${TETHER_SLURM_JOB_TIMEOUT_S:-150}

# --- 1. Can this machine run it? -------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "needs root to run slurmctld, slurmd and munged (running as uid $(id -u))"
for c in munged munge unmunge slurmctld slurmd sbatch scontrol sinfo squeue scancel sacct srun; do
  command -v "$c" > /dev/null ||
    skip "$c is missing: install the Debian packages slurmctld slurmd slurm-client munge (tools/setup)"
done
for b in tether-server tether-worker; do
  [[ -x $bin_dir/$b ]] || { echo "FAIL: $bin_dir/$b is missing or not executable (build first, or set TETHER_BIN_DIR)"; exit 1; }
done
[[ -x $sbatch_script && -x $repo/tools/deploy/slurm/tether-task ]] ||
  { echo "FAIL: $sbatch_script or tether-task next to it is missing or not executable"; exit 1; }
node=$(hostname -s)
for h in "$node" "$(hostname)"; do
  getent hosts "$h" > /dev/null ||
    skip "this host's name $h does not resolve (the job gives shard addresses by host name)"
done

log_dir=${ARTIFACT_DIR:-$(mktemp -d /tmp/tether-slurm-artifacts-XXXXXX)}
mkdir -p "$log_dir"
rm -f "$log_dir"/*.out "$log_dir"/*.log "$log_dir"/slurm.conf
events=$log_dir/events.log
: > "$events"
t0=$(date +%s.%N)
now() { awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }'; }
note() { echo "[$(now) s] $*" | tee -a "$events"; }

# Every process of a cluster this script starts (daemons, slurmstepd, job
# tasks) carries TTH_SLURM_TEST=<its directory> in its environment (given to
# the daemons and to sbatch, not exported by this shell): those left at the
# end are stopped. The directory is named after this script's PID.
# ours DIR-PATTERN: the PIDs whose TTH_SLURM_TEST matches (grep -E, whole).
ours() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    tr '\0' '\n' 2> /dev/null < "/proc/$p/environ" |
      grep -qxE "TTH_SLURM_TEST=$1" && echo "$p"
  done
  return 0
}
# What an earlier run killed by SIGKILL (a ctest timeout: no trap runs) left
# behind: its daemons die with it (setpriv), but not slurmstepd and the job's
# processes. Those of runs whose PID is gone are stopped, their dirs removed.
for d in /tmp/tether-slurm-[0-9]*-*; do
  [[ -d $d && $d =~ ^/tmp/tether-slurm-([0-9]+)-[A-Za-z0-9]+$ ]] || continue
  kill -0 "${BASH_REMATCH[1]}" 2> /dev/null && continue
  left=$(ours "${d//./\\.}")
  # shellcheck disable=SC2086
  [[ -n $left ]] && stop_pids $left
  rm -rf "$d"
done

# Everything of this cluster lives here. World-readable directories: munged
# wants its socket's directory searchable by all.
tmp=$(mktemp -d "/tmp/tether-slurm-$$-XXXXXX")
chmod 755 "$tmp"
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log" "$tmp/jobs"
chmod 755 "$tmp/munge"
export SLURM_CONF=$tmp/slurm.conf

daemon_pids=()
mark=(env "TTH_SLURM_TEST=$tmp")
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -f $SLURM_CONF ]]; then
    timeout 10 scancel --full --quiet $(timeout 5 squeue -h -o %i 2> /dev/null) 2> /dev/null || true
  fi
  stop_pids "${daemon_pids[@]}"
  local left
  left=$(ours "${tmp//./\\.}")
  if [[ -n $left ]]; then
    # shellcheck disable=SC2086
    stop_pids $left
  fi
  cp "$tmp"/log/*.log "$SLURM_CONF" "$log_dir/" 2> /dev/null || true
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

dump_logs() { tail_logs "$log_dir"/*.out "$tmp"/log/*.log; }

# If this script is SIGKILLed (no trap runs), its daemons die with it.
die_with_us=()
command -v setpriv > /dev/null && die_with_us=(setpriv --pdeathsig KILL --)

# A free TCP port, at random in 20000..59999 (ss from iproute2 when there).
used_ports=""
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 40000))
    [[ " $used_ports " == *" $p "* ]] && continue
    if command -v ss > /dev/null && ss -Htan "sport = :$p" 2> /dev/null | grep -q .; then
      continue
    fi
    used_ports+=" $p"
    echo "$p"
    return 0
  done
  return 1
}

# --- 2. munge ----------------------------------------------------------------
(umask 077 && head -c 1024 /dev/urandom > "$tmp/munge/munge.key")
chmod 400 "$tmp/munge/munge.key"
sock=$tmp/munge/munge.socket
"${mark[@]}" "${die_with_us[@]}" munged --foreground --force --socket="$sock" \
  --key-file="$tmp/munge/munge.key" --pid-file="$tmp/munge/munged.pid" \
  --log-file="$tmp/log/munged.log" --seed-file="$tmp/munge/munged.seed" \
  > "$tmp/log/munged.out.log" 2>&1 &
daemon_pids+=("$!")
for _ in $(seq 50); do [[ -S $sock ]] && break; sleep 0.1; done
if ! out=$(munge -S "$sock" -n 2>&1 | unmunge -S "$sock" 2>&1) ||
   ! grep -q 'STATUS: *Success' <<< "$out"; then
  skip "munged does not come up here: $(tail -n 3 "$tmp/log/munged.log" "$tmp/log/munged.out.log" 2> /dev/null | tr '\n' ' ') $out"
fi
note "munged up (socket $sock)"

# --- 3. slurmctld and slurmd --------------------------------------------------
ctld_port=$(free_port)
slurmd_port=$(free_port)
tether_port=$(free_port)
# One node named after this host, 16 CPUs whatever it has (config_overrides),
# so 5 tasks fit on a 2-core machine. No cgroups, no accounting daemon: job
# completion data go to a text file, which `sacct -c` reads.
cat > "$SLURM_CONF" << EOF
ClusterName=tethertest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/slurmd-%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$tmp/jobcomp.txt
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MinJobAge=600
NodeName=$node NodeAddr=127.0.0.1 CPUs=16 Boards=1 SocketsPerBoard=1 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=tether Nodes=$node Default=YES MaxTime=30 State=UP
EOF
"${mark[@]}" "${die_with_us[@]}" slurmctld -D -c -i -f "$SLURM_CONF" > "$tmp/log/slurmctld.out.log" 2>&1 &
daemon_pids+=("$!")
ctld_pid=$!
"${mark[@]}" "${die_with_us[@]}" slurmd -D -f "$SLURM_CONF" > "$tmp/log/slurmd.out.log" 2>&1 &
daemon_pids+=("$!")
slurmd_pid=$!

state=""
for _ in $(seq 60); do
  kill -0 "$ctld_pid" 2> /dev/null ||
    skip "slurmctld does not come up here: $(tail -n 5 "$tmp/log/slurmctld.log" "$tmp/log/slurmctld.out.log" 2> /dev/null | tr '\n' ' ')"
  kill -0 "$slurmd_pid" 2> /dev/null ||
    skip "slurmd does not come up here: $(tail -n 5 "$tmp/log/slurmd.log" "$tmp/log/slurmd.out.log" 2> /dev/null | tr '\n' ' ')"
  state=$(sinfo -h -n "$node" -o %T 2> /dev/null || true)
  [[ $state == idle ]] && break
  sleep 0.5
done
[[ $state == idle ]] ||
  skip "node $node is not idle after 30 s (state '${state:-none}'): $(tail -n 5 "$tmp/log/slurmctld.log" 2> /dev/null | tr '\n' ' ')"
note "slurmctld (port $ctld_port) and slurmd (port $slurmd_port) up; node $node idle"

# --- 4. The jobs --------------------------------------------------------------
ckpt=$tmp/checkpoints
# submit NAME VAR=VALUE...: sbatch tether.sbatch with these settings; prints
# the job id. (Not sbatch --wait: its poll interval grows to 10 s and more;
# wait_job polls every 0.5 s.)
submit() {
  local name=$1
  shift
  env -u TETHER_RESUME "TTH_SLURM_TEST=$tmp" "$@" TETHER_CHECKPOINT_DIR="$ckpt" TETHER_BIN_DIR="$bin_dir" \
    TETHER_PORT="$tether_port" TETHER_HTTP_PORT=0 \
    sbatch --parsable --job-name="tether-$name" --ntasks=5 --time=5 \
      --chdir="$tmp/jobs" --output="$log_dir/$name.out" "$sbatch_script" \
      2> "$log_dir/$name.sbatch.log"
}
# wait_job ID: until the job ends (at most job_timeout_s); prints its state.
wait_job() {
  local id=$1 waited=0 st
  while :; do
    st=$(scontrol show job -o "$id" 2> /dev/null | sed -nE 's/.* JobState=([A-Z_]+).*/\1/p')
    case $st in
      PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | "") ;;
      *) echo "$st"; return 0 ;;
    esac
    kill -0 "$ctld_pid" 2> /dev/null || { echo "UNKNOWN(slurmctld exited)"; return 0; }
    if (( waited++ > job_timeout_s * 2 )); then
      scancel "$id" 2> /dev/null || true
      echo "TIMEOUT_IN_TEST($st)"
      return 0
    fi
    sleep 0.5
  done
}
# sacct_state ID: State and ExitCode from the job completion data.
sacct_state() {
  local id=$1 line=""
  for _ in $(seq 20); do
    line=$(sacct -c -j "$id" -n -o State,ExitCode 2> /dev/null | awk 'NF { print $1, $2; exit }')
    [[ -n $line ]] && break
    sleep 0.5
  done
  echo "$line"
}
# check_job NAME ID: COMPLETED in Slurm and in sacct, a dashboard URL and a
# final accuracy >= min_acc in the output. Sets acc.
check_job() {
  local name=$1 id=$2 st sa out=$log_dir/$1.out
  st=$(wait_job "$id")
  [[ $st == COMPLETED ]] || fail "job $name ($id) ended $st, not COMPLETED"
  sa=$(sacct_state "$id")
  [[ $sa == "COMPLETED 0:0" ]] || fail "sacct -c says '$sa' for job $name ($id), not 'COMPLETED 0:0'"
  grep -Eq "^tether: dashboard: https?://$node:[0-9]+/ " "$out" ||
    grep -Eq "^tether: dashboard: https?://$(hostname):[0-9]+/ " "$out" ||
    fail "job $name's output has no dashboard URL"
  grep -q "dashboard.token" "$out" || fail "job $name's output does not say where the dashboard token is"
  acc=$(sed -nE 's/^tether: final test accuracy ([0-9.]+)$/\1/p' "$out" | tail -n 1)
  [[ -n $acc ]] || fail "job $name's output has no final test accuracy"
  awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' ||
    fail "job $name's final test accuracy $acc is below $min_acc"
  grep -q "^tether: done: " "$out" || fail "job $name's output does not end with 'tether: done'"
  local m
  for f in auth.key dashboard.token; do
    m=$(stat -c %a "$ckpt/job-$id/$f" 2> /dev/null || echo missing)
    [[ $m == 600 ]] || fail "job $name's $f has mode $m, not 600"
  done
  note "job $name ($id): COMPLETED (sacct -c: $sa), test accuracy $acc, $(grep -oE "dashboard: https?://[^ ]+" "$out")"
}

# http METHOD URL [TOKEN]: prints "STATUS BODY" (curl, else python3).
http() {
  local method=$1 url=$2 token=${3:-}
  if command -v curl > /dev/null; then
    local auth=()
    [[ -n $token ]] && auth=(-H "Authorization: Bearer $token")
    curl -s -m 10 -X "$method" "${auth[@]}" -w ' %{http_code}' "$url" |
      awk '{ code = $NF; $NF = ""; body = body $0 } END { print code, body }'
  else
    python3 - "$method" "$url" "$token" << 'PY'
import sys, urllib.request, urllib.error
method, url, token = sys.argv[1:4]
req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
if token:
    req.add_header("Authorization", "Bearer " + token)
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        print(r.status, r.read().decode(errors="replace").replace("\n", " "))
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode(errors="replace").replace("\n", " "))
PY
  fi
}
# dashboard_of NAME ID: waits (60 s) for the job's dashboard line; prints
# "URL TOKEN_FILE".
dashboard_of() {
  local name=$1 id=$2 line=""
  for _ in $(seq 120); do
    line=$(grep -m 1 -E "^tether: dashboard: https?://" "$log_dir/$name.out" 2> /dev/null || true)
    [[ -n $line ]] && break
    st=$(scontrol show job -o "$id" 2> /dev/null | sed -nE 's/.* JobState=([A-Z_]+).*/\1/p')
    [[ $st == PENDING || $st == RUNNING || $st == CONFIGURING ]] ||
      fail "job $name ($id) ended ($st) before it printed its dashboard"
    sleep 0.5
  done
  [[ -n $line ]] || fail "job $name ($id) printed no dashboard URL within 60 s"
  local url token_file
  url=$(sed -nE 's/^tether: dashboard: (https?:[^ ]+) .*/\1/p' <<< "$line")
  token_file=$(sed -nE 's/.*\$\(cat ([^)]+)\).*/\1/p' <<< "$line")
  echo "$url $token_file"
}

t_job1=$(now)
id1=$(submit first TETHER_SHARDS=2 TETHER_EPOCHS=2 TETHER_STALENESS=2 \
        TETHER_SLOWDOWN=3 TETHER_CHECKPOINT_EVERY=100) ||
  fail "sbatch refused the first job: $(cat "$log_dir/first.sbatch.log")"
note "job first submitted: $id1 (2 shards, 3 workers, the last 3x slower, 2 epochs)"
read -r url1 _ <<< "$(dashboard_of first "$id1")"
reply=$(http GET "${url1}api/config")
[[ $reply == "200 {"* ]] || fail "GET ${url1}api/config from job first's dashboard answered: ${reply:0:200}"
note "job first's dashboard at $url1 answers GET /api/config (200)"
check_job first "$id1"
acc1=$acc
out1=$log_dir/first.out
grep -q -- "--slowdown 3" "$out1" || fail "no worker of job first was started with --slowdown 3"
for i in 0 1; do
  grep -Eq "^$i: .*tether-server --shard-id $i .*--listen 0\.0\.0\.0:$((tether_port + i)) --advertise [^ ]+:$((tether_port + i)) " "$out1" ||
    fail "task $i of job first is not shard $i on port $((tether_port + i))"
done
end1=$(sed -nE 's/^[0-9]+: worker [0-9]+: .* clock ([0-9]+) .*\(done in .*/\1/p' "$out1" | sort -n | tail -n 1)
t_job2=$(now)

# The second job resumes the first one's run and trains a third epoch.
id2=$(submit resumed TETHER_SHARDS=2 TETHER_EPOCHS=3 TETHER_STALENESS=2 \
        TETHER_SLOWDOWN=3 TETHER_CHECKPOINT_EVERY=100 TETHER_RESUME=latest) ||
  fail "sbatch refused the resuming job: $(cat "$log_dir/resumed.sbatch.log")"
note "job resumed submitted: $id2 (TETHER_RESUME=latest, 3 epochs)"
check_job resumed "$id2"
out2=$log_dir/resumed.out
round=$(sed -nE 's/.*resumed from checkpoint round ([0-9]+).*/\1/p' "$out2" | head -n 1)
[[ -n $round ]] || round=$(sed -nE 's/^0: .*resuming from round ([0-9]+) .*/\1/p' "$out2" | head -n 1)
[[ -n $round ]] || fail "shard 0 of job resumed does not say it resumed from a round"
acc2=$acc
(( round > 0 )) || fail "job resumed resumed from round $round, not a round > 0"
grep -Eq "^[0-9]+: worker [0-9]+: resuming from round $round " "$out2" ||
  fail "no worker of job resumed says it goes on from round $round"
end2=$(sed -nE 's/^[0-9]+: worker [0-9]+: .* clock ([0-9]+) .*\(done in .*/\1/p' "$out2" | sort -n | tail -n 1)
[[ -n $end2 ]] || fail "no worker of job resumed reports its end"
(( end2 > round && end2 > ${end1:-0} )) ||
  fail "job resumed ended at clock $end2: not past round $round and job first's end (${end1:-?})"

# A long run stopped from its dashboard (POST /api/stop with the token the
# output names): the workers stop after a checkpoint round, and the job
# evaluates and ends COMPLETED long before its 50 epochs.
t_job3=$(now)
ckpt_main=$ckpt
ckpt=$tmp/checkpoints-stopped
id4=$(submit stopped TETHER_SHARDS=2 TETHER_EPOCHS=50 TETHER_STALENESS=2) ||
  fail "sbatch refused the job to stop: $(cat "$log_dir/stopped.sbatch.log")"
read -r url4 token_file4 <<< "$(dashboard_of stopped "$id4")"
[[ -f $token_file4 ]] || fail "job stopped's output names the token file '$token_file4', which does not exist"
reply=$(http POST "${url4}api/stop")
[[ $reply == 401* ]] || fail "POST /api/stop without the token answered '${reply:0:200}', not 401"
# Stop it once it has trained a while (clock 450 of about 15600: about
# 1.4 epochs of the 3 workers, past 80% test accuracy).
for _ in $(seq 240); do
  c=$(sed -nE 's/^[0-9]+: worker [0-9]+: epoch [0-9]+\/50 clock ([0-9]+) .*/\1/p' "$log_dir/stopped.out" | sort -n | tail -n 1)
  (( ${c:-0} >= 450 )) && break
  sleep 0.5
done
reply=$(http POST "${url4}api/stop" "$(cat "$token_file4")")
[[ $reply == "202 "*'"round":'[0-9]* ]] ||
  fail "POST /api/stop with the token answered '${reply:0:200}', not 202 with a round"
note "job stopped ($id4): POST ${url4}api/stop answered ${reply:0:80}"
check_job stopped "$id4"
t_job4=$(now)
ckpt=$ckpt_main

# A new run (no TETHER_RESUME) on the same checkpoint directory is refused
# before anything starts: the first run's rounds are not overwritten.
id3=$(submit refused TETHER_SHARDS=2) ||
  fail "sbatch refused the third job: $(cat "$log_dir/refused.sbatch.log")"
st3=$(wait_job "$id3")
[[ $st3 == FAILED ]] || fail "job refused ($id3) ended $st3, not FAILED"
grep -q "holds an earlier run's checkpoints: set TETHER_RESUME=latest" "$log_dir/refused.out" ||
  fail "job refused ($id3) does not say why it refused the checkpoint directory"
note "job refused ($id3): FAILED at once, naming TETHER_RESUME=latest"
t_end=$(now)

summary="PASS: job first ($id1) COMPLETED, test accuracy $acc1 at clock ${end1:-?} (${t_job1}..${t_job2} s); job resumed ($id2) resumed from round $round and trained to clock $end2, COMPLETED, test accuracy $acc2 (${t_job2}..${t_job3} s); a run stopped from its dashboard COMPLETED (test accuracy $acc, ${t_job3}..${t_job4} s); a new run on its checkpoints refused; total $t_end s; logs in $log_dir"
note "$summary" > /dev/null
echo "$summary"
