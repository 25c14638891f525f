# Source me (". ./path.sh"): creates the project's environment once, then activates it.
GOSSIP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$GOSSIP_ROOT/utils/setup_env.sh" || { echo "path.sh: environment setup failed" >&2; return 1 2>/dev/null || exit 1; }
export GOSSIP_ROOT
export PATH="${GOSSIP_VENV:-$GOSSIP_ROOT/.venv}/bin:$GOSSIP_ROOT/utils:$PATH"
export PYTHONPATH="$GOSSIP_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # several workers share the cores
export PYTHONUNBUFFERED=1
