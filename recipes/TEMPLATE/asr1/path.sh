# Source me: the project's environment (created once by utils/setup_env.sh), shared by all recipes.
# (readlink -f: a recipe dir made of links to this one, e.g. a test's scratch copy, finds the project too)
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../../path.sh"
