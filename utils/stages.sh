# shellcheck shell=bash
# What the shared stage scripts utils/run_asr.sh and utils/run_lm.sh have in common, sourced by
# them after their own options (in the recipe dir, which a recipe's run.sh cd's to):
#
#   * the options every recipe has, declared here ONCE (below, down to help_message);
#   * the command line: these options, the stage script's own, and the options of the corpus's
#     local/data.sh (an option that only local/data.sh declares goes to it: ./run.sh
#     --librispeech-root X reaches local/data.sh), then `--` and trainer overrides (in "${extra[@]}");
#   * the environment (the project's path.sh, found from this file's real location);
#   * data_prep (run local/data.sh), run_dir (the run names), train_runs (the training stage),
#     finished_runs (what the comparison stage compares: every finished run of <exp>),
#     utils_dir (the project's utils/).
#
# The stage script sets before sourcing: train_stage (its training stage: the only one a node
# with --node-rank > 0 runs), run_prefix and run_periods (the run names), epochs_key (the conf key
# that --epochs sets). Runs are named <exp>/<run_prefix><algorithm>[-<run_periods>]-n<workers>,
# single-n1 and ddp-n<workers> for the two references, each with -<tag> appended when --tag is set.
stage=0                 # first stage to run
stop_stage=100          # last stage to run
algorithms=gossip_bmuf  # one run each: single (1 worker), ddp (all-reduce every step), or any sync.algorithm (ma bmuf local_ma local_bmuf gossip_ma gossip_bmuf ...)
tag=""                  # appended to every run name (<run>-<tag>): variants of one algorithm side by side, e.g. --tag eta075 -- sync.block_momentum=0.75 (letters, digits, . _ = + and - inside)
baseline=ddp            # the comparison's reference: ddp (if run, else single), single, or a run name; never a run against itself
epochs=""               # overrides the conf's number of epochs (LM train.epochs, ASR train.max_epochs)
num_workers=4           # worker processes per node (one per GPU on GPU machines)
ngpu=""                 # same as --num-workers
num_nodes=1             # machines; run the same command on each with its --node-rank (utils/slurm.sh does it under Slurm)
node_rank=0             # > 0: this node runs the training stage only (its workers join node 0's job)
master_addr=127.0.0.1   # node 0's address
launcher=accelerate     # or torchrun
port=29500              # node 0's rendezvous port
max_restarts=0          # a worker that dies or hangs: the launcher restarts the job up to N times (results.json: "restarts")
exp=exp
help_message="Usage: ./run.sh [options] [-- trainer overrides, e.g. train.lr=2e-3 sync.period=8]"
__st_utils=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
. "$__st_utils/log.sh"

# The options of local/data.sh that the stage scripts lack are handed to it (in corpus_opts).
declare -a corpus_opts=()
if [ -x local/data.sh ]; then
  __st_help=$(local/data.sh --help) || die "local/data.sh --help failed"
  __st_data_opts=" $(sed -n 's/^  --\([A-Za-z0-9-]*\) <.*/\1/p' <<< "$__st_help" | tr '\n' ' ') "
  __st_rest=()
  while [ $# -gt 0 ]; do
    case $1 in
      --) break ;;
      -h|--help) __st_rest+=("$1"); shift; continue ;;
      --*=*) __st_name=${1%%=*}; __st_n=1 ;;
      --*) __st_name=$1; __st_n=$(($# < 2 ? 1 : 2)) ;;
      *) break ;;
    esac
    __st_name=${__st_name#--}; __st_var=${__st_name//-/_}
    if [[ "$__st_var" =~ ^[A-Za-z][A-Za-z0-9_]*$ ]] && [ -z "${!__st_var+x}" ] && [[ "$__st_data_opts" == *" $__st_name "* ]]; then
      corpus_opts+=("${@:1:__st_n}")
    else
      __st_rest+=("${@:1:__st_n}")
    fi
    shift "$__st_n"
  done
  set -- ${__st_rest[@]+"${__st_rest[@]}"} "$@"
  help_message+=$'\n'"Options of local/data.sh (this corpus's data preparation), handed on to it:"
  for __st_name in $__st_data_opts; do
    __st_var=${__st_name//-/_}
    [ -n "${!__st_var+x}" ] || help_message+=$'\n'$(grep -- "^  --$__st_name <" <<< "$__st_help")
  done
  unset __st_help __st_data_opts __st_rest __st_name __st_n __st_var
fi
. "$__st_utils/parse_options.sh"
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ -n "$ngpu" ] && num_workers=$ngpu
case $num_workers$num_nodes$node_rank in *[!0-9]*|"") die "--num-workers/--ngpu, --num-nodes and --node-rank must be integers" ;; esac
[[ $tag =~ ^([A-Za-z0-9._=+]+(-[A-Za-z0-9._=+]+)*)?$ ]] \
  || die "--tag '$tag': use letters, digits and . _ = + - ('-' inside only, not doubled: the tag ends a directory name, <run>-<tag>)"
utils_dir=$__st_utils   # the project's utils/ (its real location)
. "$utils_dir/../path.sh"
total_workers=$((num_workers * num_nodes))
if [ "$node_rank" != 0 ]; then
  # a worker node: only the training stage, whose workers join node 0's job
  [ "$stage" -le "$train_stage" ] && [ "$stop_stage" -ge "$train_stage" ] \
    || { log "node $node_rank: nothing to do outside stage $train_stage"; exit 0; }
  stage=$train_stage
  stop_stage=$train_stage
fi

data_prep() {  # data_prep FIRST LAST ARGS...: local/data.sh ARGS (and its options) if stages FIRST..LAST are due
  local first=$1 last=$2; shift 2
  [ "$stage" -le "$last" ] && [ "$stop_stage" -ge "$first" ] || return 0
  [ -x local/data.sh ] || die "local/data.sh is missing (or not executable): the recipe's data preparation (docs/RECIPES.md)"
  log "Stage $first$([ "$first" = "$last" ] || echo "-$last"): local/data.sh $*"
  local/data.sh ${corpus_opts[@]+"${corpus_opts[@]}"} "$@"
}

run_dir() {  # run_dir ALGO -> the run's exp dir
  local name
  case $1 in
    single) name=single-n1 ;;
    ddp) name=ddp-n$total_workers ;;
    *) name=$1${run_periods:+-$run_periods}-n$total_workers ;;
  esac
  echo "$exp/$run_prefix$name${tag:+-$tag}"
}

finished_runs() {  # finished_runs -> every run of <exp> named <run_prefix>... with a results.json (any algorithm, any tag)
  local f
  for f in "$exp/$run_prefix"*/results.json; do [ -f "$f" ] && dirname "$f"; done
  return 0
}

restarts_of() {  # restarts_of RESULTS_JSON -> the trainer's restart count
  python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("restarts", 0))' "$1"
}

train_runs() {  # train_runs MODULE TRAINER_ARGS...: stage $train_stage, one run per --algorithms entry
  local module=$1 algo dir workers on train_log nodes sync_args
  shift
  for algo in $algorithms; do
    dir=$(run_dir "$algo")
    if [ -f "$dir/.done" ]; then log "Stage $train_stage: $dir already trained (remove $dir/.done to retrain)"; continue; fi
    workers=$num_workers
    nodes=(--num-nodes "$num_nodes" --node-rank "$node_rank" --master-addr "$master_addr")
    case $algo in
      single) workers=1; nodes=(); sync_args=(sync.enabled=false)
        [ "$node_rank" = 0 ] || { log "Stage $train_stage: node $node_rank: 'single' runs on node 0 only"; continue; } ;;
      ddp) sync_args=(sync.enabled=false) ;;
      *) sync_args=(sync.algorithm="$algo") ;;
    esac
    [ -z "$epochs" ] || sync_args+=("$epochs_key=$epochs")
    mkdir -p "$dir"
    train_log=$dir/train.log
    [ "$node_rank" = 0 ] || train_log=$dir/train.node$node_rank.log
    on="$workers worker(s)"
    [ ${#nodes[@]} -eq 0 ] || [ "$num_nodes" -eq 1 ] || on+=" x $num_nodes nodes (this is node $node_rank)"
    log "Stage $train_stage: training '$algo' on $on ($launcher) -> $dir (log: $train_log)"
    "$utils_dir/launch.sh" --num-workers "$workers" ${nodes[@]+"${nodes[@]}"} --launcher "$launcher" --port "$port" \
      --max-restarts "$max_restarts" -- -m "$module" --exp-dir "$dir" --name "$(basename "$dir")" "$@" \
      "${sync_args[@]}" ${extra[@]+"${extra[@]}"} 2>&1 | tee -a "$train_log" | grep --line-buffered "^\[${module##*.}\]" || true
    if [ "$node_rank" != 0 ]; then
      log "Stage $train_stage: node $node_rank: its workers finished (node 0 writes $dir/results.json)"
      continue
    fi
    if [ ! -f "$dir/results.json" ]; then
      grep -E 'Error|error:' "$train_log" | grep -v Warning | sort -u | tail -n 5 >&2 || true
      die "training '$algo' failed; see $train_log"
    fi
    log "Stage $train_stage: '$algo' trained; restarts after a failed worker: $(restarts_of "$dir/results.json")"
    touch "$dir/.done"
  done
}
