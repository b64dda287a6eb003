#!/usr/bin/env bash
# Install, start and stop the REAL CodaLab 1.7.5 server (REST server, bundle
# manager, ws-server, plus a private MariaDB) on loopback, as a test peer for the
# Rust cl-worker. No Docker needed for the server itself.
#
# As in a CodaLab deployment, one front (nginx) serves the server's address: /ws/ goes to the
# ws-server and everything else to the REST server, which listens on a port of its own
# (CLW_REST_PORT + 10). A worker given only --server (every worker a manager launches, ours
# and Python's alike) derives <server>/ws from it and gets the server's nudges; without the
# front that address answered 404, and the bundle manager's every start of a run on such a
# worker waited out its send (about 1.2 s a worker) whenever the worker was between checkins.
#
#   tests/peers/codalab-server.sh install   # idempotent; cached outside the repo
#   tests/peers/codalab-server.sh start     # installs if needed; no-op if running
#   eval "$(tests/peers/codalab-server.sh env)"   # CODALAB_HOME, PATH (cl), URLs, users
#   tests/peers/codalab-server.sh status    # exit 0 iff everything is up
#   tests/peers/codalab-server.sh logs [N]  # last N lines of each service log
#   tests/peers/codalab-server.sh stop
#   tests/peers/codalab-server.sh smoke     # end-to-end check of a running peer
#   tests/peers/codalab-server.sh reset     # wipe DB + bundle store, keep install, start
#   tests/peers/codalab-server.sh sql 'SELECT ...'   # query the CodaLab DB
#   tests/peers/codalab-server.sh purge     # stop and delete the whole cache dir
#
# Everything lives in ${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/codalab.
# Settings (env, with defaults; the values used at install are remembered in
# settings.env in the cache and reused when the variables are unset later):
#   CLW_REST_PORT=2900  CLW_WS_PORT=2901  CLW_MYSQL_PORT=3306
#   (the REST server itself listens on CLW_REST_PORT + 10, behind the front)
#   CLW_WORKER_TIMEOUT_SECONDS=60  (bundle manager: dead-worker timeout)
#   CLW_REST_THREADS=20  CLW_START_TIMEOUT=90  CLW_STOP_TIMEOUT=10
#   CLW_PYTHON39=/path/to/python3.9   (default: pyenv's 3.9.18)
#   CLW_MYSQL_SQL_MODE=''  (MySQL 5.5-like, as in CodaLab's docker-compose)
# See tests/peers/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# ---------------------------------------------------------------------------
# Constants and settings
# ---------------------------------------------------------------------------
RECIPE_VERSION=2 # bump when the install steps change, to re-run them on old caches
CODALAB_PIP_SPEC="codalab==1.7.5 alembic==1.4.3 gunicorn==20.0.4 mysqlclient==1.4.1"
PIP_CONSTRAINTS=$HERE/codalab-constraints.txt # pip freeze of a working venv
APT_PACKAGES=(mariadb-server mariadb-client libmariadb-dev libmariadb-dev-compat
  build-essential pkg-config curl nginx-light)

ROOT_USER=codalab # CodaLab's root user name (server/root_user_name default), user id 0
ROOT_PASSWORD=clw-root-pass-5678 # distinct from every user and database name: the credentials scan looks for it
TEST_USER=clwtest # verified non-root user, created by add-user.py
TEST_PASSWORD=clwtest-pass-1234
DB_NAME=codalab_bundles
DB_USER=codalab
DB_PASSWORD=codalab

if [[ -z ${HOME:-} ]]; then
  HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
  export HOME
fi
CACHE_ROOT=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}
CL_DIR=$CACHE_ROOT/codalab
VENV=$CL_DIR/venv39
CL_HOME=$CL_DIR/home # CODALAB_HOME: config.json, bundle store, CLI state files
MYSQL_DIR=$CL_DIR/mysql
DATADIR=$MYSQL_DIR/data
MYSQL_SOCK=$MYSQL_DIR/mysqld.sock
RUN_DIR=$CL_DIR/run
LOG_DIR=$CL_DIR/logs
CL_FORK_SOCK=$RUN_DIR/cl-fork.sock
SETTINGS_FILE=$CL_DIR/settings.env
INSTALL_MARKER=$CL_DIR/.install-complete
VENV_MARKER=$VENV/.clw-complete
WHEELHOUSE=$CL_DIR/wheelhouse
DATADIR_MARKER=$MYSQL_DIR/.clw-initialised
WS_LAUNCHER=$VENV/bin/cl-ws-server-loopback

SAVED_REST_PORT='' SAVED_WS_PORT='' SAVED_MYSQL_PORT=''
if [[ -f $SETTINGS_FILE ]]; then
  # shellcheck source=/dev/null
  . "$SETTINGS_FILE"
fi
REST_PORT=${CLW_REST_PORT:-${SAVED_REST_PORT:-2900}}
WS_PORT=${CLW_WS_PORT:-${SAVED_WS_PORT:-2901}}
MYSQL_PORT=${CLW_MYSQL_PORT:-${SAVED_MYSQL_PORT:-3306}}
REST_BACKEND_PORT=$((REST_PORT + 10))
FRONT_DIR=$CL_DIR/front
WORKER_TIMEOUT=${CLW_WORKER_TIMEOUT_SECONDS:-60}
REST_THREADS=${CLW_REST_THREADS:-20}
START_TIMEOUT=${CLW_START_TIMEOUT:-90}
STOP_TIMEOUT=${CLW_STOP_TIMEOUT:-10}
SQL_MODE=${CLW_MYSQL_SQL_MODE-}

REST_URL=http://127.0.0.1:$REST_PORT
WS_URL=ws://127.0.0.1:$WS_PORT
# start order; stop is reversed. cl-fork: the `cl` CLI served from one process that has
# imported it (cl-fork.py; the tests' `cl` calls go through it, see testkit::cl).
# front: nginx on the REST port (/ws/ to the ws-server, the rest to the REST server).
SERVICES=(mysql ws-server rest-server front bundle-manager cl-fork)
VENV_ID="$CODALAB_PIP_SPEC constraints=$(sha256sum "$PIP_CONSTRAINTS" | cut -c1-16)"
FINGERPRINT="recipe=$RECIPE_VERSION pip=[$VENV_ID] rest=$REST_PORT backend=$REST_BACKEND_PORT ws=$WS_PORT mysql=$MYSQL_PORT root=$ROOT_USER:$ROOT_PASSWORD test=$TEST_USER:$TEST_PASSWORD"

ORIG_PATH=$PATH
export PATH="$PATH:/usr/sbin:/sbin"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PYTHONWARNINGS=ignore::FutureWarning

log() { printf '[codalab-server] %s\n' "$*" >&2; }
die() {
  printf '[codalab-server] ERROR: %s\n' "$*" >&2
  exit 1
}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo -n "$@"
  else
    die "need root for: $*"
  fi
}

# Serialise install/start/stop between concurrent callers (e.g. parallel tests).
# Services are started with fd 9 closed so that they never inherit the lock.
take_lock() {
  mkdir -p "$CL_DIR"
  exec 9>"$CL_DIR/.lock"
  if ! flock -w 900 9; then
    die "timed out waiting for $CL_DIR/.lock"
  fi
}

# Prefix for venv commands: the server's CODALAB_HOME and no CLI identity.
VENV_ENV=(env -u CODALAB_STATE -u CODALAB_SESSION -u CODALAB_USERNAME -u CODALAB_PASSWORD
  -u CODALAB_CONFIG "CODALAB_HOME=$CL_HOME" PYTHONUNBUFFERED=1)
venv_env() { "${VENV_ENV[@]}" "$@"; }

# ---------------------------------------------------------------------------
# Process helpers (pid files in $RUN_DIR; each service is a session leader)
# ---------------------------------------------------------------------------
pid_file() { echo "$RUN_DIR/$1.pid"; }

# Prints the pid of service $1 if it is running (and really ours), else fails.
service_pid() {
  local f pid state
  f=$(pid_file "$1")
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z ]] || return 1
  # Guard against pid reuse: our services all mention the cache dir in argv.
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$CL_DIR/" || return 1
  echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

rest_code() {
  curl -s -o /dev/null -m 5 -w '%{http_code}' "$REST_URL/rest/workers/info" 2>/dev/null || true
}

rest_answers() {
  local code
  code=$(rest_code)
  [[ $code == 303 || $code == 401 || $code == 200 ]]
}

service_port() {
  case $1 in
  mysql) echo "$MYSQL_PORT" ;;
  ws-server) echo "$WS_PORT" ;;
  rest-server) echo "$REST_BACKEND_PORT" ;;
  front) echo "$REST_PORT" ;;
  *) echo "" ;;
  esac
}

service_log() {
  case $1 in
  mysql) echo "$LOG_DIR/mariadb.log" ;;
  *) echo "$LOG_DIR/$1.log" ;;
  esac
}

# Launches "$@" in the background as a new session, recording its pid.
launch() {
  local name=$1
  shift
  local out
  out=$(service_log "$name")
  [[ $name == mysql ]] && out=$LOG_DIR/mariadb.out
  printf '\n===== %s: starting %s\n' "$(date -Is)" "$name" >>"$out"
  setsid "$@" </dev/null >>"$out" 2>&1 9>&- &
  echo $! >"$(pid_file "$name")"
}

log_tail() {
  local f=$1 n=${2:-40}
  if [[ -f $f ]]; then
    echo "----- tail -n $n $f" >&2
    tail -n "$n" "$f" >&2
  fi
}

stop_service() {
  local name=$1 pid pgid i target
  if ! pid=$(service_pid "$name"); then
    rm -f "$(pid_file "$name")"
    return 0
  fi
  pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ' || true)
  target=$pid
  [[ $pgid == "$pid" ]] && target=-$pid # whole group: gunicorn workers too
  kill -TERM -- "$target" 2>/dev/null || true
  local limit=$((STOP_TIMEOUT * 5))
  [[ $name == mysql ]] && limit=$((limit * 3))
  for ((i = 0; i < limit; i++)); do
    service_pid "$name" >/dev/null || break
    sleep 0.2
  done
  if service_pid "$name" >/dev/null; then
    log "$name (pid $pid) did not stop after TERM; sending KILL"
    kill -KILL -- "$target" 2>/dev/null || true
    sleep 0.3
  fi
  rm -f "$(pid_file "$name")"
  log "stopped $name (pid $pid)"
}

check_port_free() {
  local name=$1 port=$2
  if port_open "$port"; then
    die "cannot start $name: port 127.0.0.1:$port is already in use by another process ($(ss -ltnpH "sport = :$port" 2>/dev/null | head -1)). Set CLW_*_PORT to other ports."
  fi
}

mysql_client() { mariadb --no-defaults --socket="$MYSQL_SOCK" -uroot "$@"; }

start_mysql() {
  service_pid mysql >/dev/null && return 0
  check_port_free mysql "$MYSQL_PORT"
  mkdir -p "$RUN_DIR" "$LOG_DIR"
  local user_opt=()
  [[ $(id -u) -eq 0 ]] && user_opt=(--user=root)
  # A commit is written to the OS at once and flushed to disk once a second
  # (innodb-flush-log-at-trx-commit=2): a killed mariadbd (the fault suite's) loses nothing, and
  # the bundle manager's many small commits (a staged bundle's status, every iteration) do not
  # each wait for an fsync on a disk the whole suite shares.
  launch mysql "$(command -v mariadbd)" --no-defaults "${user_opt[@]}" \
    --datadir="$DATADIR" --socket="$MYSQL_SOCK" --pid-file="$MYSQL_DIR/mariadbd.pid" \
    --port="$MYSQL_PORT" --bind-address=127.0.0.1 --log-error="$LOG_DIR/mariadb.log" \
    --sql-mode="$SQL_MODE" --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=2
  local i
  for ((i = 0; i < 150; i++)); do
    if mariadb-admin --no-defaults --socket="$MYSQL_SOCK" -uroot ping >/dev/null 2>&1; then
      log "mysql up (pid $(service_pid mysql), 127.0.0.1:$MYSQL_PORT, socket $MYSQL_SOCK)"
      return 0
    fi
    service_pid mysql >/dev/null || break
    sleep 0.2
  done
  log_tail "$LOG_DIR/mariadb.log"
  log_tail "$LOG_DIR/mariadb.out"
  die "MariaDB did not come up"
}

# ---------------------------------------------------------------------------
# install: is_installed, do_install, cmd_install and their steps, in codalab-server-install.sh
# ---------------------------------------------------------------------------
# shellcheck source-path=SCRIPTDIR source=codalab-server-install.sh
. "$HERE/codalab-server-install.sh"

# ---------------------------------------------------------------------------
# start / stop / status
# ---------------------------------------------------------------------------
running_count() {
  local n=0 s
  for s in "${SERVICES[@]}"; do
    service_pid "$s" >/dev/null && n=$((n + 1))
  done
  echo "$n"
}

ensure_hosts_entry() {
  if grep -qE '^[[:space:]]*127\.0\.0\.1([[:space:]].*)?[[:space:]]ws-server([[:space:]]|$)' /etc/hosts 2>/dev/null; then
    return 0
  fi
  # Appending (not sed -i) also works when /etc/hosts is a bind mount.
  if as_root sh -c 'printf "127.0.0.1 ws-server # cl-worker test peer (tests/peers/codalab-server.sh)\n" >> /etc/hosts' 2>/dev/null; then
    log "added '127.0.0.1 ws-server' to /etc/hosts"
  else
    log "WARNING: could not add '127.0.0.1 ws-server' to /etc/hosts; each server->worker ping will stall on DNS"
  fi
}

install_ws_launcher() {
  if ! cmp -s "$HERE/ws-server-loopback.py" "$WS_LAUNCHER" 2>/dev/null ||
    [[ $(head -1 "$WS_LAUNCHER") != "#!$VENV/bin/python" ]]; then
    {
      echo "#!$VENV/bin/python"
      tail -n +2 "$HERE/ws-server-loopback.py"
    } >"$WS_LAUNCHER.tmp"
    chmod 755 "$WS_LAUNCHER.tmp"
    mv "$WS_LAUNCHER.tmp" "$WS_LAUNCHER"
  fi
}

# The front's nginx.conf: requests and responses streamed both ways (uploads of any size,
# the long checkins and downloads), websockets upgraded on /ws/.
write_front_config() {
  mkdir -p "$FRONT_DIR/tmp"
  local user=''
  [[ $(id -u) -eq 0 ]] && user='user root;'
  cat >"$FRONT_DIR/nginx.conf" <<CONF
# Written by tests/peers/codalab-server.sh: the CodaLab test peer's front.
daemon off;
$user
worker_processes 2;
pid $RUN_DIR/front-nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $FRONT_DIR/tmp/body;
  proxy_temp_path $FRONT_DIR/tmp/proxy;
  client_max_body_size 0;
  client_body_timeout 1h;
  send_timeout 1h;
  proxy_http_version 1.1;
  proxy_request_buffering off;
  proxy_buffering off;
  proxy_read_timeout 1h;
  proxy_send_timeout 1h;
  map \$http_upgrade \$connection_upgrade { default upgrade; '' close; }
  server {
    listen 127.0.0.1:$REST_PORT backlog=1024;
    location /ws/ {
      proxy_pass http://127.0.0.1:$WS_PORT/;
      proxy_set_header Upgrade \$http_upgrade;
      proxy_set_header Connection \$connection_upgrade;
    }
    location / {
      proxy_pass http://127.0.0.1:$REST_BACKEND_PORT;
      proxy_set_header Host \$http_host;
    }
  }
}
CONF
}

start_service() {
  local name=$1
  service_pid "$name" >/dev/null && return 0
  local port
  port=$(service_port "$name")
  [[ -n $port ]] && check_port_free "$name" "$port"
  case $name in
  mysql) start_mysql ;;
  ws-server)
    install_ws_launcher
    launch ws-server "${VENV_ENV[@]}" "$WS_LAUNCHER" --port "$WS_PORT"
    ;;
  rest-server)
    launch rest-server "${VENV_ENV[@]}" "$VENV/bin/cl-server" --processes 1 --threads "$REST_THREADS"
    ;;
  front)
    write_front_config
    launch front "$(command -v nginx)" -c "$FRONT_DIR/nginx.conf" -p "$FRONT_DIR/"
    ;;
  bundle-manager)
    # --sleep-time is declared type=int in 1.7.5, so 0.5 cannot be passed; its default is 0.5.
    launch bundle-manager "${VENV_ENV[@]}" "$VENV/bin/cl-bundle-manager" \
      --worker-timeout-seconds "$WORKER_TIMEOUT"
    ;;
  cl-fork)
    rm -f "$CL_FORK_SOCK"
    launch cl-fork "${VENV_ENV[@]}" "$VENV/bin/python" "$HERE/cl-fork.py" serve "$CL_FORK_SOCK"
    ;;
  esac
}

all_up() {
  [[ $(running_count) -eq ${#SERVICES[@]} ]] && rest_answers
}

cmd_start() {
  exec </dev/null
  take_lock
  if all_up; then
    log "already running ($REST_URL)"
    return 0
  fi
  if ! is_installed; then
    if [[ $(running_count) -gt 0 ]]; then
      die "settings differ from the installed ones while services are running; run '$0 stop' first"
    fi
    do_install
  fi
  local t0=$SECONDS s
  mkdir -p "$RUN_DIR" "$LOG_DIR"
  ensure_hosts_entry
  for s in "${SERVICES[@]}"; do
    start_service "$s"
  done
  local deadline=$((SECONDS + START_TIMEOUT)) ok=0
  while ((SECONDS < deadline)); do
    if rest_answers && port_open "$WS_PORT" && [[ -S $CL_FORK_SOCK ]]; then
      ok=1
      break
    fi
    for s in "${SERVICES[@]}"; do
      service_pid "$s" >/dev/null || break 2
    done
    sleep 0.25
  done
  if [[ $ok -eq 1 ]]; then
    sleep 0.5 # let the bundle manager finish its start-up before judging it
    for s in "${SERVICES[@]}"; do
      service_pid "$s" >/dev/null || ok=0
    done
  fi
  if [[ $ok -ne 1 ]]; then
    cmd_status >&2 || true
    for s in "${SERVICES[@]}"; do
      log_tail "$(service_log "$s")" 30
    done
    log_tail "$LOG_DIR/mariadb.out" 10
    die "CodaLab did not come up within ${START_TIMEOUT}s (REST $REST_URL answered '$(rest_code)'); logs in $LOG_DIR; run '$0 stop' to clean up"
  fi
  log "CodaLab up in $((SECONDS - t0)) s: REST $REST_URL, ws $WS_URL, mysql 127.0.0.1:$MYSQL_PORT"
  ensure_home_worksheets
}

# Each user's home worksheet, made once here by one `cl work` per user. CodaLab 1.7.5 makes it
# at a user's first request, unlocked: two first requests at once (tests started in parallel on
# a fresh server) make two, and every later `cl` of that user fails with "Found multiple
# worksheets with name 'home-<user>'".
ensure_home_worksheets() {
  local marker=$CL_HOME/home-worksheets.done who user pass
  [[ -e $marker ]] && return 0
  for who in root test; do
    if [[ $who == root ]]; then user=$ROOT_USER pass=$ROOT_PASSWORD; else user=$TEST_USER pass=$TEST_PASSWORD; fi
    (
      eval "$(cmd_env)"
      export CODALAB_USERNAME=$user CODALAB_PASSWORD=$pass CODALAB_SESSION=clw-home-$user
      export CODALAB_STATE=$CL_HOME/state-$user.json
      cl work >/dev/null
    ) || die "cl work as $user failed (its home worksheet); logs in $LOG_DIR"
  done
  touch "$marker"
}

cmd_stop() {
  take_lock
  local i s
  for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
    stop_service "${SERVICES[$i]}"
  done
  # Leftovers whose pid file was lost (e.g. an interrupted start): match our
  # exact service command lines under this cache dir only.
  local pid cmd
  for pid in $(ps -eo pid=); do
    [[ -r /proc/$pid/cmdline ]] || continue
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
    case $cmd in
    *"$VENV/bin/cl-server "* | *"$VENV/bin/cl-bundle-manager "* | *"$WS_LAUNCHER "* | *"--datadir=$DATADIR "* | *"cl-fork.py serve $CL_FORK_SOCK"* | *"-c $FRONT_DIR/nginx.conf"*)
      log "killing leftover process $pid: $cmd"
      kill -TERM "$pid" 2>/dev/null || true
      ;;
    esac
  done
  log "stopped"
}

# Fault injection: one service goes down (rest-server, bundle-manager, ws-server or mysql);
# `start` brings back whichever is missing.
cmd_stop_service() {
  local name=${1:-}
  [[ " ${SERVICES[*]} " == *" $name "* ]] || die "stop-service: one of ${SERVICES[*]}, not '$name'"
  take_lock
  stop_service "$name"
}

cmd_start_service() {
  local name=${1:-}
  [[ " ${SERVICES[*]} " == *" $name "* ]] || die "start-service: one of ${SERVICES[*]}, not '$name'"
  take_lock
  start_service "$name"
}

cmd_status() {
  local s pid port ok=0 code
  for s in "${SERVICES[@]}"; do
    port=$(service_port "$s")
    if pid=$(service_pid "$s"); then
      printf '%-15s running  pid %-7s %s\n' "$s" "$pid" "${port:+127.0.0.1:$port}"
    else
      printf '%-15s stopped\n' "$s"
      ok=1
    fi
  done
  code=$(rest_code)
  if rest_answers; then
    printf '%-15s answers  HTTP %s on %s/rest/workers/info\n' rest-api "$code" "$REST_URL"
  else
    printf '%-15s DOWN     (HTTP %s) %s\n' rest-api "${code:-none}" "$REST_URL"
    ok=1
  fi
  if ! is_installed; then
    printf '%-15s not installed (or settings changed) in %s\n' install "$CL_DIR"
  fi
  return $ok
}

cmd_env() {
  q() { printf 'export %s=%q\n' "$1" "$2"; }
  local path=$ORIG_PATH
  case ":$path:" in
  *":$VENV/bin:"*) ;;
  *) path=$VENV/bin:$path ;;
  esac
  cat <<EOF
# CodaLab 1.7.5 test peer (tests/peers/codalab-server.sh); use: eval "\$(tests/peers/codalab-server.sh env)"
# 'cl' below acts as the ROOT user. The CLI caches tokens per server address in
# CODALAB_STATE, so each identity needs its own state file. As the non-root user:
#   CODALAB_USERNAME="\$CLW_TEST_USER" CODALAB_PASSWORD="\$CLW_TEST_PASSWORD" CODALAB_STATE="\$CLW_TEST_STATE" cl work
# The CLI's current worksheet is per shell session; set CODALAB_SESSION=<name> to share it between processes.
EOF
  q CLW_PEER_CACHE "$CACHE_ROOT"
  q CLW_CODALAB_DIR "$CL_DIR"
  q CODALAB_HOME "$CL_HOME"
  q PATH "$path"
  q PYTHONWARNINGS ignore::FutureWarning
  q CLW_SERVER_URL "$REST_URL"
  q CLW_WS_URL "$WS_URL"
  q CLW_MYSQL_SOCKET "$MYSQL_SOCK"
  q CLW_MYSQL_URL "mysql://$DB_USER:$DB_PASSWORD@127.0.0.1:$MYSQL_PORT/$DB_NAME"
  q CLW_ROOT_USER "$ROOT_USER"
  q CLW_ROOT_PASSWORD "$ROOT_PASSWORD"
  q CLW_ROOT_STATE "$CL_HOME/state-$ROOT_USER.json"
  q CLW_TEST_USER "$TEST_USER"
  q CLW_TEST_PASSWORD "$TEST_PASSWORD"
  q CLW_TEST_STATE "$CL_HOME/state-$TEST_USER.json"
  q CODALAB_USERNAME "$ROOT_USER"
  q CODALAB_PASSWORD "$ROOT_PASSWORD"
  q CODALAB_STATE "$CL_HOME/state-$ROOT_USER.json"
  q CLW_LOG_DIR "$LOG_DIR"
  q CLW_CL_FORK "$CL_FORK_SOCK"
}

cmd_logs() {
  local n=${1:-50} s
  for s in "${SERVICES[@]}"; do
    echo "===== $s: $(service_log "$s")"
    [[ -f $(service_log "$s") ]] && tail -n "$n" "$(service_log "$s")"
  done
  echo "===== mariadbd stdout/stderr: $LOG_DIR/mariadb.out"
  [[ -f $LOG_DIR/mariadb.out ]] && tail -n "$n" "$LOG_DIR/mariadb.out"
  return 0
}

# add-user NAME: a verified non-root user NAME (created, or its password reset), the password
# read from stdin (never an argument); prints the user id.
cmd_add_user() {
  [[ $# -eq 1 && $1 =~ ^[A-Za-z0-9_.-]+$ ]] || die "usage: add-user NAME (the password on stdin)"
  service_pid mysql >/dev/null || die "mysql is not running"
  venv_env "$VENV/bin/python" "$HERE/add-user.py" "$1" - 2>>"$LOG_DIR/add-user.log"
}

cmd_sql() {
  service_pid mysql >/dev/null || die "mysql is not running"
  mysql_client "$DB_NAME" -e "$*"
}

# Wipe all CodaLab data (DB, bundle store, CLI state) but keep the install,
# then start again: a clean server for a test suite. Users are re-created.
cmd_reset() {
  cmd_stop
  take_lock
  do_install
  start_mysql
  log "reset: dropping database $DB_NAME and the bundle store"
  mysql_client -e "DROP DATABASE IF EXISTS \`$DB_NAME\`;"
  rm -rf "$CL_HOME/partitions" "$CL_HOME/worker_sockets" "$CL_HOME"/state*.json "$CL_HOME/home-worksheets.done"
  setup_db
  create_users
  cmd_start
}

# End-to-end check of a running peer, as root and as the test user: cl work,
# cl run -> staged, cl upload + cl cat, OAuth token, one fake worker checkin
# that must return a `run` message. Leaves the fake workers' bundles behind
# (they are re-staged after CLW_WORKER_TIMEOUT_SECONDS); use `reset` for a
# clean state.
cmd_smoke() {
  all_up || die "CodaLab is not running (run: $0 start)"
  eval "$(cmd_env)"
  local tmp who user pass uuid state i token reply cpus
  tmp=$(mktemp -d)
  cd "$tmp"
  for who in root test; do
    if [[ $who == root ]]; then
      user=$ROOT_USER pass=$ROOT_PASSWORD cpus=1
    else
      user=$TEST_USER pass=$TEST_PASSWORD cpus=2
    fi
    export CODALAB_USERNAME=$user CODALAB_PASSWORD=$pass
    export CODALAB_STATE=$CL_HOME/state-$user.json CODALAB_SESSION=clw-smoke-$user
    cl work >/dev/null || die "smoke($user): cl work failed"
    uuid=$(cl run "echo hello from $user") || die "smoke($user): cl run failed"
    state=
    for ((i = 0; i < 40; i++)); do
      state=$(cl info -f state "$uuid")
      [[ $state == staged ]] && break
      sleep 0.5
    done
    [[ $state == staged ]] || die "smoke($user): run $uuid is '$state', not staged"
    echo "smoke file of $user" >"smoke-$user.txt"
    cl upload "smoke-$user.txt" >/dev/null 2>&1 || die "smoke($user): cl upload failed"
    [[ $(cl cat "smoke-$user.txt") == "smoke file of $user" ]] || die "smoke($user): cl cat mismatch"
    token=$(curl -sf -u codalab_worker_client: -H 'X-Requested-With: XMLHttpRequest' \
      --data-urlencode grant_type=password --data-urlencode client_id=codalab_worker_client \
      --data-urlencode "username=$user" --data-urlencode "password=$pass" \
      "$REST_URL/rest/oauth2/token" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["access_token"])') ||
      die "smoke($user): no OAuth token"
    reply=$(curl -sf -m 30 -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
      -d '{"cpus":'"$cpus"',"gpus":0,"memory_bytes":8589934592,"free_disk_bytes":50000000000,"dependencies":[],"runs":[],"tag":null,"shared_file_system":false,"tag_exclusive":false,"exit_after_num_runs":999,"is_terminating":false,"preemptible":false}' \
      "$REST_URL/rest/workers/clw-smoke-$user/checkin") || die "smoke($user): checkin failed"
    [[ $reply == *'"type": "run"'* ]] || die "smoke($user): checkin reply has no run message: $reply"
    log "smoke($user): cl work/run/staged/upload/cat, token and checkin (run message) ok"
  done
  cd /
  rm -rf "$tmp"
  log "smoke: ok"
}

cmd_purge() {
  cmd_stop
  log "removing $CL_DIR"
  rm -rf "$CL_DIR"
}

usage() {
  cat <<EOF
usage: $0 {install|start|stop|restart|stop-service NAME|start-service NAME|status|env|logs [N]|sql 'QUERY'|smoke|reset|purge}
  cache: $CL_DIR
  REST $REST_URL  ws $WS_URL  mysql 127.0.0.1:$MYSQL_PORT
EOF
}

main() {
  local cmd=${1:-}
  [[ $# -gt 0 ]] && shift
  case $cmd in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop && cmd_start ;;
  stop-service) cmd_stop_service "$@" ;;
  start-service) cmd_start_service "$@" ;;
  status) cmd_status ;;
  env) cmd_env ;;
  logs) cmd_logs "$@" ;;
  sql) cmd_sql "$@" ;;
  add-user) cmd_add_user "$@" ;;
  reset) cmd_reset ;;
  smoke) cmd_smoke ;;
  purge) cmd_purge ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
  esac
}

main "$@"
