# shellcheck shell=bash
# Stage times, sourced by .ci/run and scripts/test.sh: each stage's wall
# time goes to one file (EFA_STAGE_TIMES, inherited by the scripts a run
# starts), and the script that created the file prints them as one table
# with the total when it exits, passed or failed, so that a slow stage shows
# in every run's log.
#   stages_init PREFIX   once, first; installs the EXIT trap (the table)
#   stage_begin NAME     a stage starts (ends the one before)
#   stage_end            it passed
#   stage_note NAME S    a row of information under the current stage (or
#                        the last): S seconds of something that ran inside it
#                        or beside it (not added to the total)
#   stage_background [--above] NAME LOG COMMAND...
#                        COMMAND in the background, its output in LOG, at the
#                        lowest CPU priority (what it computes takes only
#                        what the stages leave), or with --above at a higher
#                        one than the stages (a test that mostly waits,
#                        whose deadlines the compiles beside it must not
#                        stretch; needs root); its row comes when it ends.
#                        Stopped (its whole process group) if still running
#                        when the script that started it exits.
#   stage_wait NAME      waits for the background stage NAME to end;
#                        returns its exit status
# A stage begun and not ended when the script exits is recorded as FAILED.

stages_init() {
  stages_prefix=$1
  stages_started=$SECONDS
  stage_name=""
  stage_notes=""
  stages_owner=0
  stages_background=()
  stages_background_names=()
  if [ -z "${EFA_STAGE_TIMES:-}" ]; then
    EFA_STAGE_TIMES="$(mktemp)"
    export EFA_STAGE_TIMES
    stages_owner=1
  fi
  trap stages_exit EXIT
}

stage_begin() {
  [ -z "$stage_name" ] || stage_end
  stage_name=$1
  stage_started=$SECONDS
  echo "$stages_prefix: $stage_name ..." >&2
}

stage_record() {  # stage_record NAME SECONDS RESULT: the stage, then its notes
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$EFA_STAGE_TIMES"
  printf '%s' "$stage_notes" >> "$EFA_STAGE_TIMES"
  stage_notes=""
}

stage_end() {
  local took=$((SECONDS - stage_started))
  stage_record "$stage_name" "$took" ok
  echo "$stages_prefix: $stage_name: $took s" >&2
  stage_name=""
}

stage_note() {
  if [ -n "$stage_name" ]; then
    stage_notes+="$(printf '%s\t%s\tnote' "$1" "$2")"$'\n'
  else
    printf '%s\t%s\tnote\n' "$1" "$2" >> "$EFA_STAGE_TIMES"
  fi
}

stage_background() {
  local niceness=19
  if [ "$1" = --above ]; then
    niceness=-5
    shift
  fi
  local name=$1 log=$2
  shift 2
  # setsid: its own process group, to stop it with its children.
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid nice -n "$niceness" bash -c 'started=$SECONDS; status=0; "${@:3}" >"$2" 2>&1 || status=$?
    result="background"; [ "$status" = 0 ] || result="background: FAILED, exit $status, log $2"
    printf "%s\t%s\t%s\n" "$1" "$((SECONDS - started))" "$result" >> "$EFA_STAGE_TIMES"
    exit "$status"' \
    _ "$name" "$log" "$@" &
  stages_background+=("$!")
  stages_background_names+=("$name")
  echo "$stages_prefix: $name: started in the background (log: $log)" >&2
}

stage_wait() {
  local i status=0
  for i in "${!stages_background_names[@]}"; do
    [ "${stages_background_names[$i]}" = "$1" ] || continue
    wait "${stages_background[$i]}" || status=$?
    # Reaped: its PID may be another process's now.
    unset "stages_background[$i]" "stages_background_names[$i]"
    return "$status"
  done
  echo "$stages_prefix: no background stage '$1'" >&2
  return 2
}

stages_exit() {
  local status=$? i
  if [ -n "$stage_name" ]; then
    stage_record "$stage_name" "$((SECONDS - stage_started))" FAILED
    stage_name=""
  fi
  for i in "${!stages_background[@]}"; do
    kill -0 "${stages_background[$i]}" 2>/dev/null || continue
    kill -- -"${stages_background[$i]}" 2>/dev/null || true
    stage_record "${stages_background_names[$i]}" "$((SECONDS - stages_started))" \
      "background: stopped unfinished"
  done
  if [ "$stages_owner" = 1 ]; then
    local total=$((SECONDS - stages_started))
    {
      echo
      echo "$stages_prefix: stage times (wall clock)"
      awk -F'\t' '{
          if ($3 == "note") printf "  %-46s %6s s  (part of or beside the stage above)\n", "  " $1, $2
          else if ($3 == "background") printf "  %-46s %6s s  (in the background)\n", "  " $1, $2
          else if ($3 ~ /^background/) printf "  %-46s %6s s  (in the %s)\n", "  " $1, $2, $3
          else printf "  %-46s %6s s%s\n", $1, $2, ($3 == "ok" ? "" : "  " $3)
        }' "$EFA_STAGE_TIMES"
      printf '  %-46s %6s s  (%d min)%s\n' total "$total" "$((total / 60))" \
        "$([ "$status" = 0 ] || echo "  FAILED, exit $status")"
      # The compiler cache's hits in this run's builds on the host (the
      # image's build stages print their own): few hits, a slow run.
      if [ -n "${CCACHE_STATSLOG:-}" ] && [ -f "$CCACHE_STATSLOG" ]; then
        echo "  ccache, this run's builds on the host:" \
          "$(ccache --show-log-stats 2>/dev/null | sed -n 's/^ *Hits: *//p' | head -1)"
      fi
    } >&2
    rm -f "$EFA_STAGE_TIMES"
  fi
  return "$status"
}
