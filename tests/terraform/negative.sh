#!/usr/bin/env bash
# Negative tests of the Terraform checker: broken copies of the modules under terraform/ (a misspelled
# argument, a missing required argument, an undeclared variable, an unencrypted file system,
# an open security group, a public S3 bucket, a wrong manager_command expectation, ...) must
# each fail with the expected finding; a clean copy must pass. Non-interactive.
#
#   tests/terraform/negative.sh            # all cases, two at a time (NEGATIVE_JOBS)
#   NEGATIVE_ONLY=regex tests/terraform/negative.sh
#
# Prints PASS/FAIL per case, then `negative: N passed, M failed`. Exit 0 when every case
# behaves, 1 when one does not, 2 when the checker could not run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=
for c in ${TFCHECK_PYTHON:-} python3.11 python3.12 python3 /usr/bin/python3; do
  if c=$(command -v "$c" 2>/dev/null) &&
    "$c" -c 'import sys, venv, ensurepip; assert sys.version_info[:2] >= (3, 9)' 2>/dev/null; then
    py=$c
    break
  fi
done
if [ -z "$py" ]; then
  echo "ERROR negative: no Python >= 3.9 with the venv module (set TFCHECK_PYTHON)"
  echo "negative: could not run"
  exit 2
fi
export TFCHECK_PYTHON=$py
exec "$py" "$here/lib/negative.py" </dev/null
