#!/bin/bash
# The driver as it was before issue 39 (kept to show the failures it had:
# tests/kube/bottlerocket_failures.rs): "staged already" trusted
# thar-be-updates' bookkeeping, a failed refresh or prepare failed the node at
# once, a lost commit answer was retried into a 422.
# drover's Bottlerocket driver: moves this node to $DROVER_TARGET_VERSION
# through the node's update API and reboots it (docs/drivers.md).
#
# Baked into the updater image (deploy/updater/Dockerfile) as
# /usr/local/bin/drover-bottlerocket-update, the upgrade Job's whole command:
# the admission policy of deploy/components/bottlerocket-host-access pins the
# image's digest and this command, so a Job from the agent's token can run
# this script and nothing else. The image holds bash, jq and coreutils; the
# host's own /bin/apiclient is mounted in. Only `apiclient raw` is used,
# against endpoints every supported Bottlerocket release serves: /os,
# /settings, /tx/commit_and_apply, /updates/status and
# /actions/{refresh,prepare,activate,deactivate}-update and /actions/reboot.
#
# The update API's state machine (thar-be-updates' drive_state_machine):
# refresh is allowed in every state (Idle <-> Available), prepare in
# Available/Staged (-> Staged), activate in Staged (-> Ready), deactivate in
# Ready (-> Staged); anything else is 409. Each action runs in a forked
# child that holds the update lock, so the API answers 423 until it ends and
# its result shows in /updates/status' most_recent_command.
#
# Idempotent per attempt: the pod the Job starts again after the reboot reads
# the version, finds the target and exits 0; a marker on the host says this
# attempt already rebooted, so a node that came back at another version is
# failed, never updated twice.
#
# DROVER_ACTION=prepare (the Job drover runs before the drain, on a node
# still in service): steps 1-4 only, the target locked, checked offered and
# downloaded to the staging partition (Staged), nothing activated, no
# reboot; a target the node's repository does not offer fails here, before
# the node left service. The upgrade Job that follows the drain finds the
# target staged and goes straight to step 5.
set -euo pipefail

target="$DROVER_TARGET_VERSION"
node="$DROVER_NODE_NAME"
marker="${DROVER_STATE_DIR:-/drover-state}/attempt-$DROVER_ATTEMPT"
# Every wait is a multiple of this many seconds (tests shrink it).
unit="${DROVER_TIME_UNIT:-1}"
# Scratch space shared by the supervisor and the worker (see the end).
scratch="$(mktemp -d)"
errf="$scratch/err"
# Present once the reboot was accepted: a SIGTERM after that is the
# shutdown, which must not cancel the update it is about to boot.
rebooting="$scratch/rebooting"

log() { printf '%s drover-driver %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$node" "$*" >&2; }
fail() {
  log "$*"
  exit 1
}

# nap N: sleep N units in the background, so that a SIGTERM runs its trap at
# once instead of after the sleep.
nap() {
  sleep "$(jq -n --argjson u "$unit" --argjson n "$1" '$u * $n')" &
  wait "$!"
}

# seconds N: N units in whole seconds, at least 1.
seconds() { jq -n --argjson u "$unit" --argjson n "$1" '[($u * $n) | ceil, 1] | max'; }

# call METHOD URI [DATA]: one `apiclient raw` request. Prints the body; on
# failure the error is in $errf (see set_code).
call() {
  code=""
  local out
  if out="$(apiclient raw -m "$1" -u "$2" ${3:+-d "$3"} 2>"$errf")"; then
    printf '%s' "$out"
    return 0
  fi
  set_code
  return 1
}

# set_code: $code from the last failed call: the HTTP status apiclient
# reports for an answered request ("... Status 423 when POSTing ...",
# apiclient's lib.rs ResponseStatus), or "transport" when no answer came.
# (Read from $errf because calls often run in a $(...) subshell.)
code=""
set_code() {
  if [[ "$(cat "$errf")" =~ Status\ ([0-9]{3})\ when ]]; then
    code="${BASH_REMATCH[1]}"
  else
    code="transport"
  fi
}

# api METHOD URI [DATA]: call, retried with backoff (2, 4, 8, 16, 30, 30
# units) while the update lock is held (423), the state is being moved by
# another caller (409) or the API does not answer (it restarts with the node).
api() {
  local delay out
  for delay in 2 4 8 16 30 30 0; do
    if out="$(call "$@")"; then
      printf '%s' "$out"
      return 0
    fi
    set_code
    case "$code" in
      409 | 423 | transport) ;;
      *) break ;;
    esac
    [ "$delay" -eq 0 ] && break
    log "$1 $2: $code, retrying in $delay units"
    nap "$delay"
  done
  # 404 on /updates/status is no failure: no action ran since boot.
  [ "$code" = 404 ] || log "$1 $2 failed: $(cat "$errf")"
  return 1
}

# status: the update status; "{}" before the first update command since boot
# (the API answers 404 until thar-be-updates wrote its status file).
status() {
  local out
  if out="$(api GET /updates/status)"; then
    printf '%s' "$out"
  elif set_code && [ "$code" = 404 ]; then
    printf '{}'
  else
    return 1
  fi
}

# update_command NAME URI LIMIT: start an update action, then poll the status
# until most_recent_command is NAME with a new timestamp (as apiclient's
# update.rs wait_request does), for at most LIMIT units; fail unless it
# succeeded.
update_command() {
  local name="$1" uri="$2" before st deadline
  before="$(status | jq -r '.most_recent_command.timestamp // "none"')" ||
    fail "cannot read the update status"
  api POST "$uri" >/dev/null || fail "could not start $name"
  deadline=$(($(date +%s) + $(seconds "$3")))
  while :; do
    nap 0.5
    # Polled without backoff: 423 only says the action still runs.
    if st="$(call GET /updates/status)"; then
      if [ "$(jq -r '.most_recent_command | "\(.cmd_type) \(.timestamp)"' <<<"$st")" != "$name $before" ] &&
        [ "$(jq -r '.most_recent_command.cmd_type' <<<"$st")" = "$name" ]; then
        [ "$(jq -r '.most_recent_command.cmd_status' <<<"$st")" = Success ] ||
          fail "$name failed: $(jq -r '.most_recent_command.stderr // ""' <<<"$st")"
        return 0
      fi
    fi
    [ "$(date +%s)" -lt "$deadline" ] || fail "$name did not finish within $3 units"
  done
}

# updog_wrote STATUS: the version updog reported writing in the last
# prepare's stderr ("Starting update to V"), "no update" for "No update
# required", or nothing when it reported neither.
updog_wrote() {
  jq -r '.most_recent_command.stderr // "" | split("\n") |
    (map(select(startswith("Starting update to ")))[0] // null | if . then ltrimstr("Starting update to ") else null end) //
    (if any(. == "No update required") then "no update" else "" end)' <<<"$1"
}

# cancel_ready: if an update is activated (Ready), deactivate it, so that no
# reboot boots it. Bounded to 20 s: the pod's grace period is 30 s.
cancel_ready() {
  local st deadline=$(($(date +%s) + 20)) asked=0
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if st="$(call GET /updates/status)"; then
      [ "$(jq -r '.update_state // "Idle"' <<<"$st")" = Ready ] || {
        [ "$asked" -eq 0 ] || log "update cancelled"
        return 0
      }
      if [ "$asked" -eq 0 ] && call POST /actions/deactivate-update >/dev/null; then
        log "cancelling the activated update"
        asked=1
      fi
    elif set_code && [ "$code" = 404 ]; then
      return 0
    fi
    sleep 0.2
  done
  log "could not see the update state settle within 20 s (an action still holds the lock); left as it is"
  return 1
}

# upgrade: the steps below, run by the worker.
upgrade() {
  # The running version. Right after the reboot the API may not answer yet:
  # retried for about 5 minutes.
  current=""
  for _ in 1 2 3; do
    if current="$(api GET /os | jq -er '.version_id')"; then
      break
    fi
    current=""
    nap 10
  done
  [ -n "$current" ] || fail "cannot read the running version from the Bottlerocket API"
  if [ "$current" = "$target" ]; then
    log "runs $target"
    exit 0
  fi
  if [ -e "$marker" ]; then
    fail "rebooted for $target but runs $current"
  fi
  action="${DROVER_ACTION:-upgrade}"
  if [ "$action" = prepare ]; then
    log "preparing $target (running $current): checking it is offered and downloading it, before the drain"
  elif [ "$action" = rollback ]; then
    # A rollback is the same steps: the version lock selects an older
    # release as it selects a newer one.
    log "rolling back from $current to $target (${DROVER_FAILED_VERSION:-$current} failed its health checks)"
  else
    log "moving from $current to $target"
  fi

  # 1. An update left activated (Ready) by an earlier attempt: every action but
  #    refresh and deactivate is refused in Ready, and any reboot would boot it.
  st="$(status)" || fail "cannot read the update status"
  if [ "$(jq -r '.update_state // "Idle"' <<<"$st")" = Ready ]; then
    log "cancelling the update left activated for $(jq -r '.staging_partition.image.version // "?"' <<<"$st")"
    update_command deactivate /actions/deactivate-update 60
  fi

  # 2. Lock to exactly the target, ignoring waves: PATCH /settings in our own
  #    transaction, then commit and apply it. The API answers before the config
  #    updog reads is rendered again (thar-be-settings runs in the background),
  #    so the refresh below confirms the lock took effect.
  settings="$(jq -cn --arg v "$target" '{updates: {"version-lock": $v, "ignore-waves": true}}')"
  tx="drover-$DROVER_ATTEMPT"
  api PATCH "/settings?tx=$tx" "$settings" >/dev/null || fail "cannot set the version lock"
  api POST "/tx/commit_and_apply?tx=$tx" >/dev/null || fail "cannot commit the version lock"
  [ "$(api GET /settings | jq -r '.updates["version-lock"]')" = "$target" ] ||
    fail "the version lock did not read back as $target"

  # 3. and 4. Refresh until the update chosen is exactly the target, then
  #    download and write it to the staging partition (prepare). The API answers the
  #    commit before the files the update tools read are rendered again
  #    (thar-be-settings runs in the background), so two things are checked:
  #    - the refresh's choice: a refresh that ran before the lock was applied
  #      chooses the newest release in this node's wave, which must never be
  #      staged;
  #    - updog's own report of what prepare wrote ("Starting update to V" in
  #      the command's stderr, printed by every updog since 1.0.0). Before
  #      Bottlerocket 1.20.0 the refresh chose from the API's settings,
  #      already committed, while updog read /etc/updog.toml, not yet
  #      rendered: the refresh said the target and updog wrote the newest
  #      release. There the report must name the target; from 1.20.0 both
  #      read rendered files and a report naming another version (the two
  #      files' rendering raced) is only a second guard.
  #    Nothing is activated until both agree: a wrong image left on the
  #    staging partition is never booted, and the next prepare overwrites it.
  before_config_files="$(jq -n --arg v "$current" '($v | split("-")[0] | split(".") | map(tonumber? // 0)) < [1, 20, 0]')"
  chosen="" written="" staged=""
  # Staged by this attempt's prepare Job (before the drain): the staging
  # partition holds the target, checked by that run as below; it is not
  # downloaded again. The lock set above keeps any refresh on it.
  if [ "$action" != prepare ] &&
    [ "$(jq -r '"\(.update_state) \(.staging_partition.image.version)"' <<<"$st")" = "Staged $target" ]; then
    log "$target is staged already (prepared before the drain)"
    chosen="$target" staged=1
  fi
  for delay in 2 4 8 16 30 30 30 0; do
    [ -z "$staged" ] || break
    update_command refresh /actions/refresh-updates 300
    st="$(status)" || fail "cannot read the update status"
    chosen="$(jq -r '.chosen_update.version // "none"' <<<"$st")"
    if [ "$chosen" = "$target" ]; then
      update_command prepare /actions/prepare-update 1800
      st="$(status)" || fail "cannot read the update status"
      [ "$(jq -r '"\(.update_state) \(.staging_partition.image.version)"' <<<"$st")" = "Staged $target" ] ||
        fail "prepare left $(jq -c '{update_state, staging_partition}' <<<"$st"), not $target staged"
      written="$(updog_wrote "$st")"
      if [ "$written" = "$target" ] || { [ -z "$written" ] && [ "$before_config_files" = false ]; }; then
        break
      fi
      log "updog wrote ${written:-nothing it reported} for a refresh that chose $target: the lock to $target is not yet applied where updog reads it"
      [ "$delay" -eq 0 ] && fail "updog never wrote $target (last: ${written:-no report}); nothing was activated"
    else
      [ "$delay" -eq 0 ] && break
      log "refresh chose $chosen (offered: $(jq -r '.available_updates // [] | join(", ")' <<<"$st")), waiting for the lock to $target to apply"
    fi
    nap "$delay"
  done
  [ "$chosen" = "$target" ] ||
    fail "$target is not offered to this node (offered: $(jq -r '.available_updates // [] | join(", ")' <<<"$st"))"

  if [ "$action" = prepare ]; then
    log "$target is staged; the upgrade after the drain activates it"
    exit 0
  fi

  # 5. Activate: the staging partition becomes the next to boot.
  update_command activate /actions/activate-update 60
  st="$(status)" || fail "cannot read the update status"
  [ "$(jq -r '"\(.update_state) \(.staging_partition.image.version) \(.staging_partition.next_to_boot)"' <<<"$st")" = "Ready $target true" ] ||
    fail "activate left $(jq -c '{update_state, staging_partition}' <<<"$st"), not $target next to boot"

  # 6. Reboot. The shutdown stops this pod (SIGTERM): the Job starts it again
  #    after the reboot, and step 0 finds the target.
  touch "$marker"
  touch "$rebooting"
  log "rebooting into $target"
  if ! call POST /actions/reboot >/dev/null; then
    if [ "$code" != transport ]; then
      # The API refused (e.g. a shutdown inhibitor): no reboot is coming.
      rm -f "$rebooting" "$marker"
      fail "reboot refused: $(cat "$errf")"
    fi
    log "no answer to the reboot request: the node may be going down"
  fi
  nap 600
  rm -f "$rebooting" "$marker"
  fail "no reboot within 600 units"
}

# The supervisor. bash 5.2 can run a trap while it parses a $(...), and the
# trap's own text is then parsed in that half-built state ("unexpected EOF
# while looking for matching `)'"): the TERM is lost. So the process that
# receives the pod's SIGTERM runs no $(...) while its trap is set: it only
# waits for the worker, which runs the steps with the default TERM action in
# its own process group. On a stop the supervisor ends that group, ignores
# further signals and cancels an activated update unless the reboot was
# already asked for.
stopped=0
trap 'stopped=143' TERM
trap 'stopped=130' INT
set -m
upgrade &
worker=$!
set +m
rc=0
while :; do
  if wait "$worker"; then rc=0; else rc=$?; fi
  [ "$stopped" -eq 0 ] || break
  # wait also returns when the worker ends: nothing left to wait for then.
  kill -0 "$worker" 2>/dev/null || break
done
trap '' TERM INT
set +e
if [ "$stopped" -ne 0 ]; then
  kill -TERM -- "-$worker" 2>/dev/null
  wait "$worker" 2>/dev/null
  if [ "$stopped" -eq 130 ]; then log "stopped by SIGINT"; else log "stopped by SIGTERM"; fi
  rc="$stopped"
fi
if [ "$rc" -ne 0 ] && [ ! -e "$rebooting" ]; then
  cancel_ready
fi
rm -rf "$scratch"
exit "$rc"
