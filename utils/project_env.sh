# shellcheck shell=bash
# The project's environment for a utils/*.sh tool started outside it (a fresh shell in a recipe
# dir, no `. path.sh` first):
#
#   command -v accelerate >/dev/null || . "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/project_env.sh" "accelerate is not on PATH"
#
# The project root is this file's real location (readlink -f / pwd -P), never the recipe dir
# that a `utils` link was reached through. If the environment exists and is up to date, it is
# activated (the top-level path.sh) with one line on stderr saying so and why (the argument).
# If it does not exist yet (or requirements changed), the tool refuses with the command that
# builds it: path.sh would create a venv of about 6 GB, which a data-dir check or a launch should
# not start by surprise.
__pe_root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd -P)
__pe_venv=${GOSSIP_VENV:-$__pe_root/.venv}
__pe_why=${1:-"the environment of the project is not active"}
if ! "$__pe_root/utils/setup_env.sh" --check; then
  echo "$(basename "$0"): $__pe_why, and $__pe_venv is missing or out of date:" \
    "set it up once with '. $__pe_root/path.sh' (creates it: about 6 GB of pinned packages, a few minutes), then rerun" >&2
  exit 1
fi
echo "$(basename "$0"): $__pe_why: using $__pe_venv (. $__pe_root/path.sh)" >&2
# shellcheck disable=SC1091
. "$__pe_root/path.sh"
unset __pe_root __pe_venv __pe_why
