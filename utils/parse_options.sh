# shellcheck shell=bash
# Kaldi-style command-line option parsing for recipe scripts.
#
# Usage, inside a recipe's run.sh (after defining every option with its default):
#
#   stage=0
#   stop_stage=100
#   use_gpu=true
#   help_message="Usage: $0 [options] <data-dir>"
#   . utils/parse_options.sh     # parses and removes the options from "$@"
#   data_dir=$1                  # positional arguments are left in "$@"
#
# Rules:
#   --some-name VALUE | --some-name=VALUE
#       sets the shell variable some_name (dashes become underscores). The variable must
#       already be defined by the calling script, otherwise this prints
#       "unknown option --some-name" with the list of valid options and exits 1.
#       If the default is true/false, VALUE must be true or false.
#   --config FILE
#       sources FILE (shell assignments such as `stage=2`) before any other option is
#       applied, so options given on the command line override the config file.
#   --help | -h
#       prints $help_message (if set) and the options with their current values; exits 0.
#   --
#       ends option parsing; everything after it stays in "$@".
# Parsing stops at the first argument that does not start with "--" (or is not -h).
# Works under `set -euo pipefail`. All helper variables are prefixed with __po_ and unset
# at the end, so they can neither leak into the caller nor be set from the command line.
#
# A script that hands its command line on to another one (a recipe's run.sh to the shared
# stages utils/run_asr.sh) sets `keep_unknown_options=true` before sourcing this file: the
# options it does not define, --help and --config FILE then stay in "$@" (in their order, before
# a `--` and what follows it) for that other script, which checks them.

# Valid option names: simple assignments (`name=...`) in the calling script before the line
# that sourced this file, and in the scripts that sourced the caller before the lines that did
# so (utils/run_asr.sh sources utils/stages.sh, which sources this file: the options of both
# count), which are currently defined. Falls back to the caller's non-exported lower-case
# variables when the caller is not a file (e.g. bash -c).
__po_caller=${BASH_SOURCE[1]-}     # the script that sourced this file ...
__po_callers=("${BASH_SOURCE[@]:1}")                        # ... it and the scripts that sourced it
__po_caller_lines=("${BASH_LINENO[@]:0:${#__po_callers[@]}}")  # ... and the lines they did so on
__po_script=$0                                              # the script that was run: named in errors
[ "${#__po_callers[@]}" -eq 0 ] || __po_script=${__po_callers[${#__po_callers[@]}-1]}
__po_keep=${keep_unknown_options:-false}
__po_kept=()

__po_list_options() {
  local __po_src __po_line __po_names __po_n __po_k
  if [ -n "$__po_caller" ] && [ -f "$__po_caller" ]; then
    __po_names=$(for ((__po_k = ${#__po_callers[@]} - 1; __po_k >= 0; __po_k--)); do   # outermost first
        __po_src=${__po_callers[__po_k]} __po_line=${__po_caller_lines[__po_k]}
        [ -f "$__po_src" ] || continue
        [ "$__po_line" -gt 0 ] 2>/dev/null || __po_line=$(wc -l < "$__po_src")
        head -n "$__po_line" "$__po_src"
      done | sed -n 's/^[[:space:]]*\(export[[:space:]]\{1,\}\)\{0,1\}\([A-Za-z][A-Za-z0-9_]*\)=.*/\2/p' \
      | awk '!seen[$0]++')
  else
    __po_names=$(comm -23 <(compgen -v | sort) <(compgen -e | sort) | grep -E '^[a-z][a-z0-9_]*$' || true)
  fi
  for __po_n in $__po_names; do
    case $__po_n in help_message|keep_unknown_options) continue ;; esac
    [ -n "${!__po_n+x}" ] || continue
    printf '%s\n' "$__po_n"
  done
}

__po_print_options() {
  local __po_n __po_opts
  __po_opts=$(__po_list_options)
  if [ -z "$__po_opts" ]; then
    echo "  (this script defines no options)"
    return 0
  fi
  for __po_n in $__po_opts; do
    printf '  --%-24s # default: %s\n' "${__po_n//_/-} <${__po_n}>" "${!__po_n}"
  done
}

__po_die() {
  echo "$(basename -- "$__po_script"): ERROR: $*" >&2
  exit 1
}

__po_unknown() {
  {
    echo "$(basename -- "$__po_script"): ERROR: unknown option --$1"
    echo "Valid options are:"
    __po_print_options
    echo "Run with --help for usage."
  } >&2
  exit 1
}

# Pass 1: source every --config FILE among the leading options.
__po_i=1
while [ "$__po_i" -le $# ]; do
  __po_arg=${!__po_i}
  case "$__po_arg" in
    --) break ;;
    --config=*)
      __po_cfg=${__po_arg#--config=} ;;
    --config)
      __po_i=$((__po_i + 1))
      [ "$__po_i" -le $# ] || __po_die "option --config requires a file argument"
      __po_cfg=${!__po_i} ;;
    -h|--help) __po_i=$((__po_i + 1)); continue ;;
    --*=*) __po_i=$((__po_i + 1)); continue ;;
    --*) __po_i=$((__po_i + 2)); continue ;;  # option + its value
    *) break ;;
  esac
  [ -f "$__po_cfg" ] || __po_die "config file '$__po_cfg' (given by --config) does not exist"
  # shellcheck disable=SC1090
  . "$__po_cfg" || __po_die "failed to source config file '$__po_cfg'"
  [ "$__po_keep" = true ] && __po_kept+=(--config "$__po_cfg")   # the next script reads it too
  __po_i=$((__po_i + 1))
done

# Pass 2: apply the options in order, removing them from "$@".
while [ $# -gt 0 ]; do
  case "$1" in
    --)
      [ "$__po_keep" = true ] || shift
      break ;;
    --help|-h)
      if [ "$__po_keep" = true ]; then __po_kept+=("$1"); shift; continue; fi
      if [ -n "${help_message-}" ]; then printf '%s\n' "$help_message"; fi
      echo "Options (current default values):"
      __po_print_options
      exit 0 ;;
    --*=*)
      __po_opt=${1%%=*}; __po_opt=${__po_opt#--}; __po_val=${1#*=}; shift ;;
    --*)
      __po_opt=${1#--}
      [ $# -ge 2 ] || __po_die "option --$__po_opt requires a value"
      __po_val=$2; shift 2 ;;
    *)
      break ;;
  esac
  [ "$__po_opt" = config ] && continue  # already sourced in pass 1
  __po_name=${__po_opt//-/_}
  if [[ ! "$__po_opt" =~ ^[A-Za-z][A-Za-z0-9_-]*$ ]] || [ -z "${!__po_name+x}" ]; then
    [ "$__po_keep" = true ] || __po_unknown "$__po_opt"
    __po_kept+=("--$__po_opt" "$__po_val")    # not ours: for the script we hand "$@" on to
    continue
  fi
  case "${!__po_name}" in
    true|false)
      case "$__po_val" in
        true|false) ;;
        *) __po_die "option --$__po_opt expects true or false, got '$__po_val'" ;;
      esac ;;
  esac
  printf -v "$__po_name" '%s' "$__po_val" 2>/dev/null \
    || __po_die "cannot set option --$__po_opt (variable $__po_name is read-only?)"
done

[ ${#__po_kept[@]} -eq 0 ] || set -- "${__po_kept[@]}" "$@"
unset __po_i __po_arg __po_cfg __po_opt __po_val __po_name __po_caller __po_callers __po_caller_lines __po_script __po_keep __po_kept
unset -f __po_list_options __po_print_options __po_die __po_unknown
true
