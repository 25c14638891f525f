# shellcheck shell=bash
# Logging helpers for recipe scripts (in the style of icefall / ESPnet).
#
#   . utils/log.sh
#   log "Stage 1: preparing data"   # -> stderr: [2024-05-01 12:00:00] (run.sh:42) Stage 1: preparing data
#   die "missing $dir"              # logs "ERROR: missing ..." the same way, then exits 1
#
# Works under `set -euo pipefail`; uses only bash builtins (no `date` fork).

# __log_at DEPTH MESSAGE...: log with the location of the caller DEPTH frames up.
__log_at() {
  local depth=$1; shift
  local src=${BASH_SOURCE[depth + 1]-} line=${BASH_LINENO[depth]-0}
  [ -n "$src" ] || src=$0
  printf '[%(%Y-%m-%d %H:%M:%S)T] (%s:%s) %s\n' -1 "${src##*/}" "$line" "$*" >&2
}

log() {
  __log_at 1 "$@"
}

die() {
  __log_at 1 "ERROR: $*"
  exit 1
}
