# Source me: the project's environment (created once by utils/setup_env.sh), shared by all recipes.
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/path.sh"
