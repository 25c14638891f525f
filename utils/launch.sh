#!/usr/bin/env bash
# Start N training workers with `accelerate launch` (default) or torchrun.
#
#   utils/launch.sh [--num-workers 4] [--launcher accelerate|torchrun] [--port 29500] \
#       -- -m gossip_accel.bin.train_lm --config conf/x.yaml --exp-dir exp/x sync.period=8
#
# On CPU, `accelerate launch --cpu --num_processes 4` starts ONE process; what starts N gloo
# workers is `--multi_gpu --num_processes N` with Accelerator(cpu=True) in the script (our
# entry points choose cpu=True when no GPU is visible). On GPUs the same command starts one
# process per GPU. For several nodes pass accelerate's own flags through ACCELERATE_EXTRA.
set -euo pipefail
num_workers=4
launcher=accelerate
port=29500
help_message="Usage: utils/launch.sh [options] -- <python args: -m module or script.py ...>"
. "$(dirname "${BASH_SOURCE[0]}")/parse_options.sh"
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "$help_message" >&2; exit 1; }
# called outside a recipe (path.sh not sourced): use the project's environment
command -v "$launcher" >/dev/null 2>&1 || . "$(dirname "${BASH_SOURCE[0]}")/../path.sh"

case $launcher in
  accelerate)
    if [ "$num_workers" -gt 1 ]; then
      exec accelerate launch --multi_gpu --num_processes "$num_workers" --num_machines 1 \
        --mixed_precision no --dynamo_backend no --main_process_port "$port" ${ACCELERATE_EXTRA:-} "$@"
    fi
    exec accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no \
      --dynamo_backend no ${ACCELERATE_EXTRA:-} "$@" ;;
  torchrun)
    exec torchrun --nnodes 1 --nproc_per_node "$num_workers" --master_port "$port" "$@" ;;
  *) echo "launch.sh: --launcher must be accelerate or torchrun, got '$launcher'" >&2; exit 1 ;;
esac
