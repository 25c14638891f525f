#!/usr/bin/env bash
# Start N training workers with `accelerate launch` (default) or torchrun, on one or several machines.
#
#   utils/launch.sh [--num-workers 4] [--launcher accelerate|torchrun] [--port 29500] [--max-restarts 0] \
#       [--num-nodes 1 | MIN:MAX] \
#       -- -m gossip_accel.bin.train_lm --config conf/x.yaml --exp-dir exp/x sync.period=8
#
# --max-restarts N: when a worker dies (killed, out of memory) or fails (a CollectiveTimeout
# because a peer hangs), the launcher stops the others and starts the whole job again, up to
# N times; the trainers resume from their newest complete checkpoint (train.checkpoint_every_steps
# makes those frequent) and write the count ("restarts") into results.json.
#
#   # two machines, 4 workers each (8 in all): run the same command on both, with its node rank
#   utils/launch.sh --num-workers 4 --num-nodes 2 --node-rank 0 --master-addr 10.0.0.1 -- ...   # on 10.0.0.1
#   utils/launch.sh --num-workers 4 --num-nodes 2 --node-rank 1 --master-addr 10.0.0.1 -- ...   # on the other
#
# --num-workers is the number of worker processes on THIS machine (one per GPU on GPU machines);
# the job has num_workers x num_nodes workers. The flags become
#   accelerate: --num_processes <workers x nodes> --num_machines <nodes> --machine_rank <rank>
#               --main_process_ip <master-addr> --main_process_port <port>
#   torchrun:   --nnodes <nodes> --node_rank <rank> --nproc_per_node <workers>
#               --master_addr <master-addr> --master_port <port>   (static rendezvous)
# Every node must reach master-addr:port (node 0 listens there) and the nodes must reach each
# other (gloo/NCCL pick further ports). utils/slurm.sh runs this once per node under Slurm.
#
# Elastic (torchrun only): --num-nodes MIN:MAX, e.g. `--launcher torchrun --num-nodes 1:2 --max-restarts 3`,
# run on every node (no --node-rank): torchrun's c10d rendezvous at master-addr:port (job id
# $RDZV_ID, default gossip_accel) admits MIN to MAX nodes. When a node dies, the others fail
# their next collective (CollectiveTimeout / PeerLost), their agents restart the workers and meet
# again without it, and the trainers resume the newest checkpoint on the smaller world: the
# replicas are averaged and the data re-sharded (train.elastic, docs/RELIABILITY.md "Elastic
# resume"; the checkpoint directory must be shared by the nodes). Rerunning the same command
# with a smaller --num-workers after a job died resumes the same way.
#
# On CPU, `accelerate launch --cpu --num_processes 4` starts ONE process; what starts N gloo
# workers is `--multi_gpu --num_processes N` with Accelerator(cpu=True) in the script (our
# entry points choose cpu=True when no GPU is visible). On GPUs the same command starts one
# process per GPU. Extra launcher flags: ACCELERATE_EXTRA / TORCHRUN_EXTRA (e.g. TORCHRUN_EXTRA=
# "--rdzv-backend c10d --rdzv-endpoint host:port --rdzv-id job42" for an elastic rendezvous).
set -euo pipefail
num_workers=4
num_nodes=1
node_rank=0
master_addr=127.0.0.1   # the address of node 0 (its --port must be reachable from every node)
launcher=accelerate
port=29500
max_restarts=0
help_message="Usage: utils/launch.sh [options] -- <python args: -m module or script.py ...>"
. "$(dirname "${BASH_SOURCE[0]}")/parse_options.sh"
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "$help_message" >&2; exit 1; }
min_nodes=""  # --num-nodes MIN:MAX (elastic, torchrun): MIN here, MAX in num_nodes
case $num_nodes in
  *:*) min_nodes=${num_nodes%%:*}; num_nodes=${num_nodes#*:}
       [ "$launcher" = torchrun ] || { echo "launch.sh: --num-nodes MIN:MAX (elastic) needs --launcher torchrun" >&2; exit 1; }
       case $min_nodes in ''|*[!0-9]*) echo "launch.sh: --num-nodes MIN:MAX must be two integers" >&2; exit 1 ;; esac
       [ "$min_nodes" -ge 1 ] && [ "$min_nodes" -le "$num_nodes" ] \
         || { echo "launch.sh: --num-nodes $min_nodes:$num_nodes: need 1 <= MIN <= MAX" >&2; exit 1; } ;;
esac
case $num_workers$num_nodes$node_rank$max_restarts in *[!0-9]*) echo "launch.sh: --num-workers, --num-nodes, --node-rank and --max-restarts must be integers" >&2; exit 1 ;; esac
[ "$num_nodes" -ge 1 ] && [ "$num_workers" -ge 1 ] || { echo "launch.sh: --num-workers and --num-nodes must be >= 1" >&2; exit 1; }
[ "$node_rank" -lt "$num_nodes" ] || { echo "launch.sh: --node-rank $node_rank must be below --num-nodes $num_nodes" >&2; exit 1; }
# called outside a recipe (path.sh not sourced): the project's environment (utils/project_env.sh)
command -v "$launcher" >/dev/null 2>&1 \
  || . "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/project_env.sh" "$launcher is not on PATH"
total=$((num_workers * num_nodes))

case $launcher in
  accelerate)
    if [ "$num_nodes" -gt 1 ]; then
      exec accelerate launch --multi_gpu --num_processes "$total" --num_machines "$num_nodes" \
        --machine_rank "$node_rank" --main_process_ip "$master_addr" --main_process_port "$port" \
        --max_restarts "$max_restarts" --mixed_precision no --dynamo_backend no ${ACCELERATE_EXTRA:-} "$@"
    fi
    if [ "$num_workers" -gt 1 ]; then
      exec accelerate launch --multi_gpu --num_processes "$num_workers" --num_machines 1 \
        --mixed_precision no --dynamo_backend no --main_process_port "$port" --max_restarts "$max_restarts" \
        ${ACCELERATE_EXTRA:-} "$@"
    fi
    # one process: no elastic agent, so no restarts (rerun the command: it resumes)
    [ "$max_restarts" = 0 ] || echo "launch.sh: --max-restarts needs 2+ workers (one worker has no elastic agent); ignored" >&2
    exec accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no \
      --dynamo_backend no ${ACCELERATE_EXTRA:-} "$@" ;;
  torchrun)
    if [ -n "$min_nodes" ]; then  # elastic: the c10d rendezvous decides the nodes and ranks
      exec torchrun --nnodes "$min_nodes:$num_nodes" --nproc_per_node "$num_workers" --rdzv-backend c10d \
        --rdzv-endpoint "$master_addr:$port" --rdzv-id "${RDZV_ID:-gossip_accel}" --max-restarts "$max_restarts" \
        ${TORCHRUN_EXTRA:-} "$@"
    fi
    if [ "$num_nodes" -gt 1 ]; then
      exec torchrun --nnodes "$num_nodes" --node_rank "$node_rank" --nproc_per_node "$num_workers" \
        --master_addr "$master_addr" --master_port "$port" --max-restarts "$max_restarts" ${TORCHRUN_EXTRA:-} "$@"
    fi
    exec torchrun --nnodes 1 --nproc_per_node "$num_workers" --master_port "$port" --max-restarts "$max_restarts" \
      ${TORCHRUN_EXTRA:-} "$@" ;;
  *) echo "launch.sh: --launcher must be accelerate or torchrun, got '$launcher'" >&2; exit 1 ;;
esac
