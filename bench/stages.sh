# Shared by the prepared GPU scripts (sourced): install the wheels in .whl/ (unless SMOKE is set), and
# stage NAME LIMIT_S COMMAND... runs one stage with its own time limit, cut to what DEADLINE leaves,
# logging to $LOG and recording the outcome in STATUS. Set DEADLINE, OUT and LOG first; lines that
# match $HIDE (a grep pattern; default: none) stay in the log and out of the console.
export PYTHONUNBUFFERED=1
if [ -z "${SMOKE:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
STATUS=()

stage() {
  local name=$1 limit=$2 left t0 rc
  shift 2
  left=$((DEADLINE - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit < 15)); then
    STATUS+=("$name: SKIPPED, the deadline is near")
    return
  fi
  echo "=== $name (limit ${limit} s): $*" | tee -a "$LOG"
  t0=$SECONDS
  timeout -k 5 "$limit" "$@" 2>&1 | grep --line-buffered -v "should be kept in float32" | tee -a "$LOG" \
    | if [ -n "${HIDE:-}" ]; then grep -v "$HIDE"; else cat; fi
  rc=${PIPESTATUS[0]}
  case $rc in
    0) STATUS+=("$name: ok, $((SECONDS - t0)) s") ;;
    124 | 137) STATUS+=("$name: TIMED OUT after $((SECONDS - t0)) s (limit $limit s)") ;;
    *) STATUS+=("$name: FAILED (exit $rc), $((SECONDS - t0)) s") ;;
  esac
}
