# Source me (". ./path.sh"): creates the project's environment once, then activates it.
# the project root from this file's real location (-P: not the recipe dir a `utils` link was reached through)
GOSSIP_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)
"$GOSSIP_ROOT/utils/setup_env.sh" || { echo "path.sh: environment setup failed" >&2; return 1 2>/dev/null || exit 1; }
export GOSSIP_ROOT
# tools/kenlm/bin: KenLM's lmplz and build_binary once utils/install_kenlm.sh has built them
export PATH="${GOSSIP_VENV:-$GOSSIP_ROOT/.venv}/bin:$GOSSIP_ROOT/utils:$GOSSIP_ROOT/tools/kenlm/bin:$PATH"
export PYTHONPATH="$GOSSIP_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # several workers share the cores
export PYTHONUNBUFFERED=1
