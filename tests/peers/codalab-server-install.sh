# shellcheck shell=bash
# shellcheck disable=SC2154 # the settings (CL_DIR, VENV, DB_NAME, ...) are codalab-server.sh's
# The install steps of tests/peers/codalab-server.sh (sourced by it, never run): the apt
# packages, the Python 3.9 venv of CodaLab 1.7.5, the private MariaDB datadir and database,
# CodaLab's config.json and its users; `install` and the installed-or-not test. Uses the
# caller's settings and helpers (log, die, as_root, take_lock, log_tail, venv_env, mysql_client,
# service_pid, start_mysql, stop_service, running_count).

is_installed() {
  [[ -f $INSTALL_MARKER && $(<"$INSTALL_MARKER") == "$FINGERPRINT" ]] &&
    [[ -f $VENV_MARKER && -f $DATADIR_MARKER && -d $DATADIR/mysql && -f $CL_HOME/config.json ]] &&
    "$VENV/bin/python" -c 'pass' 2>/dev/null
}

ensure_apt() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    return 0
  fi
  log "apt: installing ${missing[*]}"
  # Never start Debian's own mariadb service: we run a private instance.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    made_policy=1
  fi
  local rc=0
  {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
  } >"$LOG_DIR/install-apt.log" 2>&1 </dev/null || rc=$?
  [[ $made_policy -eq 1 ]] && as_root rm -f "$policy"
  if [[ $rc -ne 0 ]]; then
    log_tail "$LOG_DIR/install-apt.log"
    die "apt-get failed (see $LOG_DIR/install-apt.log)"
  fi
}

find_python39() {
  local c cands=()
  [[ -n ${CLW_PYTHON39:-} ]] && cands+=("$CLW_PYTHON39")
  if command -v pyenv >/dev/null; then
    cands+=("$(pyenv root 2>/dev/null)/versions/3.9.18/bin/python3.9")
  fi
  cands+=("${PYENV_ROOT:-$HOME/.pyenv}/versions/3.9.18/bin/python3.9" /root/.pyenv/versions/3.9.18/bin/python3.9)
  for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.9.*/bin/python3.9 /root/.pyenv/versions/3.9.*/bin/python3.9; do
    cands+=("$c")
  done
  c=$(command -v python3.9 || true)
  [[ -n $c ]] && cands+=("$c")
  for c in "${cands[@]}"; do
    if [[ -x $c ]] && "$c" -c 'import sys, venv; assert sys.version_info[:2] == (3, 9)' 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  die "no Python 3.9 found (CodaLab 1.7.5 needs 3.9; tried: ${cands[*]}). Set CLW_PYTHON39."
}

ensure_venv() {
  if [[ -f $VENV_MARKER && $(<"$VENV_MARKER") == "$VENV_ID" ]] &&
    "$VENV/bin/python" -c 'pass' 2>/dev/null; then
    return 0
  fi
  local py
  py=$(find_python39)
  rm -rf "$VENV"
  "$py" -m venv "$VENV"
  # pip's own cache is not reliable here, so keep the built wheels of the whole
  # dependency set in the cache dir: a venv rebuild then needs no network.
  local pip=("$VENV/bin/pip") rc=0
  if [[ ! -f $WHEELHOUSE/.clw-complete || $(<"$WHEELHOUSE/.clw-complete") != "$VENV_ID" ]]; then
    log "venv: downloading/building wheels for $CODALAB_PIP_SPEC into $WHEELHOUSE (about 2 min cold)"
    rm -rf "$WHEELHOUSE"
    mkdir -p "$WHEELHOUSE"
    # shellcheck disable=SC2086 # word splitting of the spec is intended
    {
      "${pip[@]}" install -c "$PIP_CONSTRAINTS" wheel &&
        "${pip[@]}" wheel -c "$PIP_CONSTRAINTS" -w "$WHEELHOUSE" $CODALAB_PIP_SPEC
    } >"$LOG_DIR/install-pip.log" 2>&1 </dev/null || rc=$?
    if [[ $rc -ne 0 ]]; then
      log_tail "$LOG_DIR/install-pip.log"
      die "pip wheel failed (see $LOG_DIR/install-pip.log)"
    fi
    printf '%s' "$VENV_ID" >"$WHEELHOUSE/.clw-complete"
  fi
  log "venv: installing into $VENV with $py from $WHEELHOUSE"
  # shellcheck disable=SC2086 # word splitting of the spec is intended
  if ! "${pip[@]}" install --no-index --find-links "$WHEELHOUSE" -c "$PIP_CONSTRAINTS" \
    $CODALAB_PIP_SPEC >>"$LOG_DIR/install-pip.log" 2>&1 </dev/null; then
    log_tail "$LOG_DIR/install-pip.log"
    die "pip install failed (see $LOG_DIR/install-pip.log)"
  fi
  printf '%s' "$VENV_ID" >"$VENV_MARKER"
}

ensure_datadir() {
  if [[ -f $DATADIR_MARKER && -d $DATADIR/mysql ]]; then
    return 0
  fi
  log "mysql: initialising a private datadir in $DATADIR"
  stop_service mysql
  rm -rf "$DATADIR"
  mkdir -p "$DATADIR"
  local user_opt=()
  [[ $(id -u) -eq 0 ]] && user_opt=(--user=root)
  if ! mariadb-install-db --no-defaults "${user_opt[@]}" --datadir="$DATADIR" \
    --auth-root-authentication-method=socket --skip-test-db \
    >"$LOG_DIR/mariadb-install-db.log" 2>&1 </dev/null; then
    log_tail "$LOG_DIR/mariadb-install-db.log"
    die "mariadb-install-db failed"
  fi
  touch "$DATADIR_MARKER"
}

setup_db() {
  local u
  {
    echo "CREATE DATABASE IF NOT EXISTS \`$DB_NAME\`;"
    for u in localhost 127.0.0.1; do
      echo "CREATE USER IF NOT EXISTS '$DB_USER'@'$u' IDENTIFIED BY '$DB_PASSWORD';"
      echo "ALTER USER '$DB_USER'@'$u' IDENTIFIED BY '$DB_PASSWORD';"
      echo "GRANT ALL PRIVILEGES ON \`$DB_NAME\`.* TO '$DB_USER'@'$u';"
    done
    echo "FLUSH PRIVILEGES;"
  } | mysql_client
}

configure_codalab() {
  mkdir -p "$CL_HOME"
  venv_env "$VENV/bin/python" "$HERE/configure.py" \
    "cli/default_address=$REST_URL" \
    "server/engine_url=mysql://$DB_USER:$DB_PASSWORD@127.0.0.1:$MYSQL_PORT/$DB_NAME" \
    "server/rest_host=127.0.0.1" \
    "server/rest_port=$REST_BACKEND_PORT" \
    "ws-server/ws_port=$WS_PORT" \
    "server/admin_email=admin@example.com" \
    "server/support_email=admin@example.com" \
    "server/default_user_info/disk_quota=100g" \
    "server/default_user_info/time_quota=100y" \
    "server/default_user_info/edu_disk_quota=100g" \
    "server/default_user_info/edu_time_quota=100y" \
    "server/default_user_info/parallel_run_quota=100" \
    >>"$LOG_DIR/install-codalab.log" 2>&1 </dev/null ||
    { log_tail "$LOG_DIR/install-codalab.log"; die "configuring $CL_HOME/config.json failed"; }
}

create_users() {
  local scripts=("$VENV"/lib/python3.*/site-packages/scripts/create-root-user.py)
  local script=${scripts[0]}
  [[ -f $script ]] || die "create-root-user.py not found in $VENV"
  (cd "$CL_DIR" && venv_env "$VENV/bin/python" "$script" "$ROOT_PASSWORD") \
    >>"$LOG_DIR/install-codalab.log" 2>&1 </dev/null ||
    { log_tail "$LOG_DIR/install-codalab.log"; die "create-root-user.py failed"; }
  venv_env "$VENV/bin/python" "$HERE/add-user.py" "$TEST_USER" "$TEST_PASSWORD" \
    >>"$LOG_DIR/install-codalab.log" 2>&1 </dev/null ||
    { log_tail "$LOG_DIR/install-codalab.log"; die "add-user.py $TEST_USER failed"; }
}

step() {
  local t=$SECONDS
  "$@"
  printf '%s %s: %s s\n' "$(date -Is)" "$1" "$((SECONDS - t))" >>"$LOG_DIR/install-steps.log"
}

do_install() {
  if is_installed; then
    return 0
  fi
  local t0=$SECONDS
  log "installing CodaLab 1.7.5 test peer into $CL_DIR"
  mkdir -p "$CL_DIR" "$RUN_DIR" "$LOG_DIR" "$CL_HOME" "$MYSQL_DIR"
  rm -f "$INSTALL_MARKER"
  if [[ ${#MYSQL_SOCK} -gt 100 ]]; then
    die "socket path too long for a unix socket (${#MYSQL_SOCK} chars): $MYSQL_SOCK; use a shorter CLW_PEER_CACHE"
  fi
  step ensure_apt
  step ensure_venv
  step ensure_datadir
  local started_mysql=0
  if ! service_pid mysql >/dev/null; then
    start_mysql
    started_mysql=1
  fi
  step setup_db
  printf 'SAVED_REST_PORT=%s\nSAVED_WS_PORT=%s\nSAVED_MYSQL_PORT=%s\n' \
    "$REST_PORT" "$WS_PORT" "$MYSQL_PORT" >"$SETTINGS_FILE"
  step configure_codalab
  step create_users
  [[ $started_mysql -eq 1 ]] && stop_service mysql
  printf '%s' "$FINGERPRINT" >"$INSTALL_MARKER"
  log "install complete in $((SECONDS - t0)) s"
}

cmd_install() {
  exec </dev/null
  take_lock
  if is_installed; then
    log "already installed in $CL_DIR"
    return 0
  fi
  if [[ $(running_count) -gt 0 ]]; then
    log "note: services are running; restart them (stop, start) to apply new settings"
  fi
  do_install
}
