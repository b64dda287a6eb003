# Helpers shared by the peer scripts (sourced, never run). The caller defines `die`, and for
# take_lock also `BASE` and `load_settings`.

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# log_tail FILE [N]: the last N lines of FILE on stderr, if it has any.
log_tail() {
  local f=$1 n=${2:-30}
  if [[ -s $f ]]; then
    echo "----- tail -n $n $f" >&2
    tail -n "$n" "$f" >&2
  fi
}

# elapsed START: seconds since START (an $EPOCHREALTIME value), one decimal.
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

# Serialise install/start/stop between concurrent callers (e.g. parallel tests). Servers are
# started with fd 9 closed so that they never inherit the lock.
take_lock() {
  mkdir -p "$BASE"
  exec 9>"$BASE/.lock"
  flock -w "${CLW_PEER_LOCK_WAIT:-300}" 9 || die "timed out waiting for $BASE/.lock"
  load_settings # another caller may have started or stopped the server meanwhile
}

# live_pid PID_FILE ARGV_PART: prints the pid in PID_FILE if that process is alive (not a
# zombie) and its argv contains ARGV_PART (a guard against pid reuse), else fails.
live_pid() {
  local file=$1 part=$2 pid state
  [[ -f $file ]] || return 1
  pid=$(<"$file")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$part" || return 1
  echo "$pid"
}

# find_venv_python VAR: the real interpreter (not a pyenv shim) of a Python >= 3.9 with the
# venv module: the one named by the environment variable VAR, else the first found.
find_venv_python() {
  local var=$1 c cands=()
  [[ -n ${!var:-} ]] && cands+=("${!var}")
  cands+=(python3.11 /usr/bin/python3.11 python3.12 python3 /usr/bin/python3)
  for c in "${cands[@]}"; do
    c=$(command -v "$c" 2>/dev/null) || continue
    if c=$("$c" -c 'import sys, venv, ensurepip; assert sys.version_info[:2] >= (3, 9); print(sys.executable)' 2>/dev/null) &&
      [[ -x $c ]]; then
      echo "$c"
      return 0
    fi
  done
  die "no Python >= 3.9 with the venv module found (tried: ${cands[*]}). Set $var."
}

# child_alive PID: our own just-started child is running (not exited, not a zombie). Unlike
# live_pid it does not look at argv, which still reads as the shell between fork and exec.
child_alive() {
  [[ -r /proc/$1/stat && $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]
}

# term_then_kill NAME PID TIMEOUT: SIGTERM, up to TIMEOUT seconds for the caller's
# `server_pid` to stop finding it, then SIGKILL and up to 3 s more.
term_then_kill() {
  local name=$1 pid=$2 timeout=$3 i
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < timeout * 10; i++)); do
    server_pid >/dev/null || return 0
    sleep 0.1
  done
  log "$name (pid $pid) did not stop after TERM; sending KILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 30; i++)); do
    server_pid >/dev/null || return 0
    sleep 0.1
  done
}

# cmd_stop: stops the caller's server (its `stop_server` prints the pid, or fails if none ran).
cmd_stop() {
  exec </dev/null
  take_lock
  local pid
  if pid=$(stop_server); then
    log "stopped (pid $pid)"
  else
    log "not running"
  fi
}
