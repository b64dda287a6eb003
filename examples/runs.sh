#!/usr/bin/env bash
# Stages the example runs on the worker queue $TAG and prints "<uuid> <name>" per run.
# Needs `cl` logged in to the server (CODALAB_USERNAME/CODALAB_PASSWORD or a session).
set -euo pipefail
: "${TAG:?set TAG to the worker tag (request queue) the runs go to}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
uuid() { awk '/^0x/ {u=$1} END {print u}'; }
run() { # run <name> [cl run options...] <command>
  local name=$1
  shift
  echo "$(cl run --request-queue "$TAG" -n "$name" "$@" | uuid) $name"
}

words=$(cl upload "$here/data/words.txt" | uuid)
run hello 'echo hello from CodaLab'
run distinct-words "data:$words" 'sort -u data | wc -l'
# (`%…%` in a command is CodaLab's inline-dependency syntax, so no `%` here.)
run primes 'mawk "BEGIN { for (n = 2; n < 60; n++) { p = 1; for (d = 2; d * d <= n; d++) if (n / d == int(n / d)) p = 0; if (p) s = s n \" \" }; print s }"'
run checksum 'seq 1 100000 > numbers.txt && sha256sum numbers.txt | head -c 16; echo'
# 3 GiB is more than the default 2 GiB shape: this one gets a `large-memory` worker.
run big-request --request-memory 3g 'head -c 50000000 /dev/zero | wc -c'
