#!/bin/bash
# A manual check of torchrun's elastic path (not run by pytest: minutes, and it waits on torchrun's
# rendezvous timeouts): two agents ("nodes") on this machine, `utils/launch.sh --launcher torchrun
# --num-nodes 1:2 --num-workers 2 --max-restarts 2`, 4 workers of the tiny LM (bmuf); after the
# first epoch-3 checkpoint agent B and its workers are killed (SIGKILL). Agent A's workers fail
# with PeerLost, A restarts them, the rendezvous admits A alone, and the 2 workers resume the
# 4-worker checkpoint elastically ("[train] resuming a 4-worker checkpoint on 2 workers ...") and
# finish (agent A rc=0). Usage: tests/scripts/elastic_two_agents.sh <lm data dir> <out dir>
# (an LM data dir as tests/test_faults.py's lm_data fixture makes: wiki.*.tokens + vocab.txt).
set -u
DATA=$(readlink -f "$1"); OUT=$(readlink -f "$2"); mkdir -p "$OUT"
cd "$(dirname "$(readlink -f "$0")")/../.." && . ./path.sh
export OMP_NUM_THREADS=1
X=$OUT/exp; rm -rf $X; mkdir -p $X
C=recipes/wikitext103/lm1/conf
PORT=$(python -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])")
ARGS="tests/scripts/fault_train.py lm --config $C/mini.yaml --config $C/period_16_128.yaml --exp-dir $X data.dir=$DATA sync.algorithm=bmuf model.hidden_size=32 model.projection_size=16 model.embedding_dim=16 model.head_size=40 model.num_tails=1 train.streams=4 train.bptt=8 train.epochs=12 sync.period=3 sync.components.0.period=6 sync.components.0.shards=2 train.checkpoint_every_steps=3 train.collective_timeout=30 sync.warmup_steps=0"
nice -n 5 bash utils/launch.sh --launcher torchrun --num-nodes 1:2 --num-workers 2 --max-restarts 2 --port $PORT -- $ARGS > $OUT/a.log 2>&1 &
A=$!
for i in $(seq 300); do python -c "import socket,sys;s=socket.socket();sys.exit(s.connect_ex(('127.0.0.1',$PORT)))" && break; sleep 1; done
echo "agent A hosts the rendezvous store after ${i}s"; sleep 2
setsid nice -n 5 bash utils/launch.sh --launcher torchrun --num-nodes 1:2 --num-workers 2 --max-restarts 2 --port $PORT -- $ARGS > $OUT/b.log 2>&1 &
B=$!
for i in $(seq 600); do ls $X/checkpoints/epoch3*/done >/dev/null 2>&1 && break; sleep 1; done
echo "checkpoint after ${i}s; killing agent B (pgid $B)"
VICTIMS="$(pgrep -g $B) $(for p in $(pgrep -g $B); do pgrep -P $p; done)"
echo "killing agent B's processes and workers: $VICTIMS"
kill -9 $VICTIMS
wait $A; echo "agent A rc=$?"
grep -a "resuming a\|done:" $OUT/a.log
