#!/usr/bin/env bash
# The offline Terraform checker: formatting, schema validation against stub providers,
# `terraform test` with mock providers, checkov and trivy, for every module and example under
# terraform/ (or the directories given). Non-interactive; needs only PyPI, once.
#
#   tests/terraform/check.sh [DIR...]
#
# Prints one line per finding, `FAIL [kind] file:line:col: message` (kinds: fmt, syntax,
# validate, test, checkov, trivy), then `terraform: N passed, M failed`.
# Exit status: 0 clean, 1 findings, 2 could not run. Tools are installed (pinned) under
# ${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/terraform; see tests/terraform/README.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

find_python() {
  local c
  for c in ${TFCHECK_PYTHON:-} python3.11 python3.12 python3 /usr/bin/python3; do
    if c=$(command -v "$c" 2>/dev/null) &&
      "$c" -c 'import sys, venv, ensurepip; assert sys.version_info[:2] >= (3, 9)' 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

py=$(find_python) || {
  echo "ERROR tfcheck: no Python >= 3.9 with the venv module (set TFCHECK_PYTHON)"
  echo "terraform: could not run"
  exit 2
}
export TFCHECK_PYTHON=$py
exec "$py" "$here/lib/tfcheck.py" check "$@" </dev/null
