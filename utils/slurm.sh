#!/usr/bin/env bash
#SBATCH --job-name=gossip_accel
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=slurm-%j.out
# A Slurm job script (sbatch template) that starts one training job on every node of the
# allocation, in the spirit of Kaldi's slurm.pl: ONE `srun` with one task per node, and in each
# task utils/launch.sh (accelerate launch or torchrun), which starts the node's workers itself.
# Never wrap launch.sh in a second srun, and never start one srun task per GPU: the launcher
# would then start workers x tasks processes ("doubled srun").
#
#   # a training command (what comes after -- is what utils/launch.sh runs), 4 nodes x 8 GPUs:
#   sbatch --nodes 4 --gpus-per-node 8 utils/slurm.sh --num-workers 8 -- \
#       -m gossip_accel.bin.train_asr --config conf/train_dnn.yaml --exp-dir exp/dnn_bmuf-n32 sync.algorithm=bmuf
#   # a recipe's training stage (its run.sh gets --num-nodes/--node-rank/--master-addr/--port):
#   cd recipes/swbd/asr1 && sbatch --nodes 2 --gpus-per-node 8 ../../../utils/slurm.sh \
#       --run "./run.sh --stage 4 --stop-stage 4 --ngpu 8"
#   # inside an allocation (salloc), the same without sbatch: utils/slurm.sh --num-workers 8 -- ...
#
# Per node: --node-rank = $SLURM_NODEID, --num-nodes = $SLURM_JOB_NUM_NODES, --master-addr = the
# first host of $SLURM_JOB_NODELIST (scontrol show hostnames), --port = 20000 + job id % 20000
# unless given. Run the data stages before (on one node), and the decoding stages after: a
# node with --node-rank > 0 runs only the training stage of a recipe.
set -euo pipefail
num_workers=1          # worker processes per node (= GPUs per node)
launcher=accelerate    # accelerate | torchrun
port=""                # default: 20000 + SLURM_JOB_ID % 20000
run=""                 # a recipe command to run on every node instead of launch.sh
help_message="Usage: [sbatch [sbatch options]] utils/slurm.sh [options] (-- <python args> | --run \"<recipe command>\")"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/parse_options.sh"
[ "${1:-}" = "--" ] && shift
[ -n "$run" ] || [ $# -gt 0 ] || { echo "$help_message" >&2; exit 1; }
[ -n "${SLURM_JOB_ID:-}" ] || { echo "slurm.sh: not inside a Slurm job (submit it with sbatch, or run it under salloc)" >&2; exit 1; }
num_nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
[ -n "$port" ] || port=$((20000 + SLURM_JOB_ID % 20000))

if [ -z "${GOSSIP_SLURM_TASK:-}" ]; then
  # the batch step: one task per node; each runs this script again as that node's task
  opts=(--num-workers "$num_workers" --launcher "$launcher" --port "$port")
  [ -z "$run" ] || opts+=(--run "$run")
  export GOSSIP_SLURM_TASK=1
  exec srun --nodes="$num_nodes" --ntasks="$num_nodes" --ntasks-per-node=1 --kill-on-bad-exit=1 \
    bash "$here/slurm.sh" "${opts[@]}" -- "$@"
fi

# one node's task
node_rank=${SLURM_NODEID:?slurm.sh: SLURM_NODEID is not set (not started by srun?)}
master_addr=$(scontrol show hostnames "${SLURM_JOB_NODELIST:?}" | awk 'NR == 1')   # awk reads all: no SIGPIPE under pipefail
[ -n "$master_addr" ] || { echo "slurm.sh: cannot read the first host of SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST" >&2; exit 1; }
echo "slurm.sh: node $node_rank of $num_nodes ($(hostname)), master $master_addr:$port, $num_workers worker(s) per node" >&2
multi=(--num-nodes "$num_nodes" --node-rank "$node_rank" --master-addr "$master_addr" --port "$port")
if [ -n "$run" ]; then
  read -r -a cmd <<< "$run"
  exec "${cmd[0]}" "${multi[@]}" "${cmd[@]:1}"
fi
exec "${GOSSIP_LAUNCH:-$here/launch.sh}" --num-workers "$num_workers" "${multi[@]}" --launcher "$launcher" -- "$@"
