#!/bin/bash
# tpuctl startup script: the resume contract, run as root by the guest agent on every
# boot. Rendered by `tpuctl render`; edit the spec, not this file.
#
# Only the values block differs between specs (each value shell-quoted once); the rest is the
# fixed text of tpuctl's template (tpuctl/render/startup.sh), which only ever expands those
# variables in double quotes. It needs bash >= 4.4 (empty arrays under `set -u`), flock and
# curl; setpriv (or runuser), useradd and fuser are used when present.
# shellcheck disable=SC2088 # paths with a literal ~ are the spec's, resolved by resolve_path

# --- values from the spec (each one shell-quoted) ---
SPEC_NAME='emulator-demo'
RUN_NAME='emulator-demo'
JOB_USER='tpuctl'
WORKDIR_SPEC='~/job'
CODE='../scripts/toy_train.py'
CHECKPOINT_DIR_SPEC='/tmp/tpuctl-demo/ckpt'
CHECKPOINT_ROOT_SPEC='/tmp/tpuctl-demo/ckpt'
DONE_MARKER_SPEC='/tmp/tpuctl-demo/ckpt/tpuctl/emulator-demo/DONE'
ZONE_CLAIM_SPEC=''
WORKER_STATES_SPEC='/tmp/tpuctl-demo/ckpt/tpuctl/emulator-demo/workers'
FRAMEWORK='orbax'
JOB_COMMAND='python3 toy_train.py --steps 300 --step-seconds 0.2 --checkpoint-every 25'
MULTISLICE=1
AUTOCHECKPOINT=1
TARGET_STEP=300
SETUP_COMMANDS=()
JOB_ENV=()
STATE_ROOT='/var/lib/tpuctl'
LOG_ROOT='/var/log/tpuctl'
CODE_READY_MARKER='.tpuctl-uploaded'
BOOT_SCRIPT=''
GRACE_SECONDS=300
NOFILE_LIMIT=1048576

# The framework preset's flags, filled in once the checkpoint dir is resolved.
preset_args() {
  PRESET_ARGS=()
}

# --- fixed part ---
set -Eeuo pipefail
umask 022

# TPUCTL_VM_ROOT is set only by tpuctl's emulator, where many "VMs" share one machine and one
# OS user: every machine-global path goes under it, and no users are created or switched.
VM_ROOT="${TPUCTL_VM_ROOT:-}"
METADATA_URL="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance/attributes"
HEARTBEAT_SECONDS="${TPUCTL_HEARTBEAT_SECONDS:-10}"
# How long before the platform takes the VM back (a flex-start run's end) the trainer is
# stopped: the grace Autocheckpoint gives before maintenance.
RUN_END_LEAD_SECONDS=$GRACE_SECONDS
PLATFORM_POLL_SECONDS="${TPUCTL_PLATFORM_POLL_SECONDS:-5}"
TPUCTL_DIR="$VM_ROOT$STATE_ROOT"
STATE_DIR="$TPUCTL_DIR/$RUN_NAME"
LOG_DIR="$VM_ROOT$LOG_ROOT/$RUN_NAME"
# Without checkpoint.dir the marker is on this disk; with one it is in the shared checkpoint dir
# (resolved below), where it outlives a repaired worker's new disk and any machine can see it.
DONE_MARKER="$STATE_DIR/DONE"
CHECKPOINT_ROOT=""
# An Orbax step folder: `N` or `<prefix>_N` (a local save in progress is `N.orbax-checkpoint-tmp…`).
STEP_NAME='^([^/]*_)?([0-9]+)$'
BOOT_LOG=""
STATUS_STATE=starting BOOT=0 TRAINER_PID="" STARTED="" EXIT_CODE="" REASON="" SIGNALLED=0
# This worker's state object beside the run's journal (set once the worker knows who it is),
# for supervisors that cannot reach it over SSH: written when the state changes, and every
# STATE_HEARTBEAT_SECONDS while the trainer runs.
WORKER_STATE="" LAST_STEP="" RESUMED_FROM="" LAST_SHARED=""
STATE_HEARTBEAT_SECONDS="${TPUCTL_STATE_HEARTBEAT_SECONDS:-60}"

# To the guest agent's journal (stderr) and to this boot's log, which is what `tpuctl logs` reads.
LOG_TO_STDERR=1
log() {
  local line
  TZ=UTC printf -v line '%(%Y-%m-%dT%H:%M:%SZ)T tpuctl-startup: %s' -1 "$*"
  if ((LOG_TO_STDERR)); then printf '%s\n' "$line" >&2; fi
  if [[ -n $BOOT_LOG ]]; then printf '%s\n' "$line" >>"$BOOT_LOG" || true; fi
  return 0
}

# KEY=value lines, replaced by rename so a reader never sees half a file.
write_status() {
  local tmp="$STATE_DIR/.status.$BASHPID"
  {
    printf 'state=%s\n' "$STATUS_STATE"
    printf 'boot=%s\n' "$BOOT"
    printf 'pid=%s\n' "$TRAINER_PID"
    printf 'started=%s\n' "$STARTED"
    printf 'exit_code=%s\n' "$EXIT_CODE"
    printf 'heartbeat=%(%s)T\n' -1
    printf 'reason=%s\n' "${REASON//$'\n'/ }"
    printf 'signalled=%s\n' "${SIGNALLED:-0}"
  } >"$tmp" && mv -f "$tmp" "$STATE_DIR/status"
  write_shared_state
}

# JSON_OUT+=,"KEY":VALUE for a string (quotes, backslashes and control characters escaped) or
# a number (null when it is none), with builtins only: no subshell, the heartbeat writes often.
json_add_string() {
  local LC_ALL=C text=$2
  text=${text//\\/\\\\}
  text=${text//\"/\\\"}
  text=${text//$'\n'/\\n}
  text=${text//$'\r'/\\r}
  text=${text//$'\t'/\\t}
  text=${text//[$'\001'-$'\037']/}
  JSON_OUT+=",\"$1\":\"$text\""
}

json_add_number() {
  if [[ $2 =~ ^-?[0-9]+$ ]]; then JSON_OUT+=",\"$1\":$2"; else JSON_OUT+=",\"$1\":null"; fi
}

# The state object, when what it says changed (or with `force`, for the heartbeat).
write_shared_state() {
  [[ -n $WORKER_STATE ]] || return 0
  local body text tmp now
  JSON_OUT=""
  json_add_string state "$STATUS_STATE"
  json_add_number boot "$BOOT"
  json_add_number pid "$TRAINER_PID"
  json_add_string started "$STARTED"
  json_add_number exit_code "$EXIT_CODE"
  json_add_number signalled "${SIGNALLED:-0}"
  json_add_string reason "${REASON//$'\n'/ }"
  json_add_number last_step "$LAST_STEP"
  json_add_number resumed_from "$RESUMED_FROM"
  body=$JSON_OUT
  if [[ ${1:-} != force && $body == "$LAST_SHARED" ]]; then return 0; fi
  LAST_SHARED=$body
  printf -v now '%(%s)T' -1
  JSON_OUT="{\"version\":1"
  json_add_string run "$RUN_NAME"
  json_add_number slice "$SLICE_ID"
  json_add_number worker "$WORKER_ID"
  json_add_string node "${NODE_ID:-}"
  json_add_number heartbeat "$now"
  text="$JSON_OUT$body}"
  case $WORKER_STATE in
    gs://*) printf '%s\n' "$text" | gcs_write "$WORKER_STATE" >/dev/null 2>&1 ||
      log "warning: cannot write the state object $WORKER_STATE" ;;
    *)
      # Its folder is made when the first write finds none (not before every write).
      tmp="$WORKER_STATE.tmp.$BASHPID"
      { { printf '%s\n' "$text" >"$tmp" ||
        { mkdir -p -- "${WORKER_STATE%/*}" && printf '%s\n' "$text" >"$tmp"; }; } &&
        mv -f -- "$tmp" "$WORKER_STATE"; } 2>/dev/null ||
        log "warning: cannot write the state object $WORKER_STATE"
      ;;
  esac
  return 0
}

# The last training step the job logged (`step N/…` or `completed step: N`), into LAST_STEP,
# and the step it said it resumed from (`resumed from step N`, near its start) into
# RESUMED_FROM.
read_last_step() {
  local tail line head
  [[ -n $BOOT_LOG && -e $BOOT_LOG ]] || return 0
  if [[ -z $RESUMED_FROM ]]; then
    head=$(head -c 16384 -- "$BOOT_LOG" 2>/dev/null) || head=""
    if [[ $head =~ resumed\ from\ step\ ([0-9]+) ]]; then RESUMED_FROM=${BASH_REMATCH[1]}; fi
  fi
  tail=$(tail -c 4096 -- "$BOOT_LOG" 2>/dev/null) || return 0
  while IFS= read -r line; do
    if [[ $line =~ step\ ([0-9]+)/ || $line =~ completed\ step:\ ([0-9]+) ]]; then
      LAST_STEP=${BASH_REMATCH[1]}
    fi
  done <<<"$tail"
  return 0
}

# Anything that fails before the trainer starts is a failed setup; say so where tpuctl looks.
# shellcheck disable=SC2317 # called by the ERR trap
on_error() {
  local rc=$? line=$1 command=$2
  trap - ERR
  REASON="line $line: '$command' exited with $rc"
  STATUS_STATE=setup-failed
  log "setup failed: $REASON"
  write_status || true
  exit 1
}
trap 'on_error "$LINENO" "$BASH_COMMAND"' ERR

fail_setup() {
  trap - ERR
  REASON=$1
  STATUS_STATE=setup-failed
  log "setup failed: $REASON"
  write_status || true
  exit 1
}

metadata() {
  curl -fsS --retry 5 --retry-delay 1 --retry-connrefused --connect-timeout 3 --max-time 10 \
    -H 'Metadata-Flavor: Google' "$METADATA_URL/$1"
}

# When the platform takes this VM back (a flex-start run's maximum run duration, a
# reservation-bound window's end), as epoch seconds; fails when it will not. A Cloud TPU VM
# serves it as instance/scheduling/termination-time, a Compute Engine one as
# termination-timestamp: whichever exists.
termination_epoch() {
  local base=${METADATA_URL%/attributes}/scheduling key text
  for key in termination-time termination-timestamp; do
    text=$(curl -fsS --connect-timeout 2 --max-time 5 -H 'Metadata-Flavor: Google' \
      "$base/$key" 2>/dev/null) || continue
    date -u -d "$text" +%s 2>/dev/null && return 0
  done
  return 1
}

# The address of a worker named by its instance name (a Compute Engine TPU VM's endpoints):
# the VPC's internal DNS, or on the emulator its stand-in, $TPUCTL_VM_ROOT/etc/hosts.
host_address() {
  local name=$1 address names entry
  if [[ -n $VM_ROOT ]]; then
    [[ -r $VM_ROOT/etc/hosts ]] || return 1
    while read -r address names; do
      [[ $address == \#* ]] && continue
      for entry in $names; do
        if [[ $entry == "$name" ]]; then
          printf '%s' "$address"
          return 0
        fi
      done
    done <"$VM_ROOT/etc/hosts"
    return 1
  fi
  read -r address _ < <(getent hosts "$name") && [[ -n $address ]] && printf '%s' "$address"
}

# tpu_env_value VAR KEY: VAR set to KEY's value in tpu-env (empty when it has none), whose
# lines are like `MEGASCALE_SLICE_ID: '1'`. It sets, not prints: no subshell per key.
tpu_env_value() {
  local line value
  printf -v "$1" '%s' ""
  while IFS= read -r line; do
    [[ ${line%%:*} == "$2" ]] || continue
    value=${line#*:}
    value=${value#"${value%%[![:space:]]*}"}
    value=${value#\'}
    printf -v "$1" '%s' "${value%\'}"
    return 0
  done <<<"$TPU_ENV"
  return 0
}

# `~`, `~/x` and relative paths live in the job user's home; absolute ones on the (emulated) VM.
resolve_path() {
  local path=$1
  case $path in
    "~") RESOLVED=$JOB_HOME ;;
    "~/"*) RESOLVED="$JOB_HOME/${path#"~/"}" ;;
    /*) RESOLVED="$VM_ROOT$path" ;;
    *) RESOLVED="$JOB_HOME/$path" ;;
  esac
}

# The checkpoint dir is shared storage: a bucket, or an absolute path that all emulated workers
# share the way they would share a bucket, so only `~` and relative paths are rewritten.
resolve_shared_path() {
  case $1 in
    gs://* | /*) RESOLVED=$1 ;;
    *) resolve_path "$1" ;;
  esac
}

# Cloud Storage through gcloud when the image has it, else gsutil (older images). A lookup
# answers 0 (found), 1 (not there) or 2 (it could not tell: no tool, permission, network),
# with the reason in LOOKUP_ERROR: a failed check is never an answer.
LOOKUP_ERROR=""
gcs_tool() {
  if command -v gcloud >/dev/null; then GCS=(gcloud storage); return 0; fi
  if command -v gsutil >/dev/null; then GCS=(gsutil -q); return 0; fi
  LOOKUP_ERROR="neither gcloud nor gsutil is installed to read $1"
  return 2
}

# What gcloud and gsutil say when there is simply nothing there.
# shellcheck disable=SC2317 # called by gcs_lookup, itself called through with_retries
absent() {
  case $1 in
    *"matched no objects"* | *"No URLs matched"* | *"NotFound"* | *"404"* | *"not found"*) return 0 ;;
    *) return 1 ;;
  esac
}

# shellcheck disable=SC2317 # called through with_retries
gcs_lookup() { # exists|list URL → 0 found (list printed), 1 nothing there, 2 error
  local out rc=0
  gcs_tool "$2" || return 2
  out=$("${GCS[@]}" ls -- "$2" 2>&1) || rc=$?
  if ((rc == 0)); then
    if [[ $1 == list ]]; then printf '%s\n' "$out"; fi
    return 0
  fi
  if absent "$out"; then return 1; fi
  LOOKUP_ERROR="cannot read $2: ${out//$'\n'/ }"
  return 2
}

gcs_write() {
  gcs_tool "$1" || return 2
  if [[ ${GCS[0]} == gcloud ]]; then gcloud storage cp - "$1"; else gsutil -q cp - "$1"; fi
}

# A lookup that fails is tried again (a network blip); one that keeps failing is an error.
with_retries() {
  local attempt rc=0
  for attempt in 1 2 3 4; do
    rc=0
    "$@" || rc=$?
    ((rc == 2)) || return "$rc"
    log "warning: $LOOKUP_ERROR (attempt $attempt)"
    if ((attempt < 4)); then sleep $((attempt * ${TPUCTL_LOOKUP_RETRY_SECONDS:-2})); fi
  done
  return 2
}

# Only the marker says a job is done, never an exit code: 0 done, 1 not done, 2 cannot tell.
# shellcheck disable=SC2317 # called through with_retries
done_marker_lookup() {
  case $DONE_MARKER in
    gs://*) gcs_lookup exists "$DONE_MARKER" ;;
    *) [[ -e $DONE_MARKER ]] ;;
  esac
}

done_marker_exists() {
  with_retries done_marker_lookup
}

write_done_marker() {
  local tmp text="$*"
  case $DONE_MARKER in
    gs://*) printf '%s\n' "$text" | gcs_write "$DONE_MARKER" ;;
    *)
      tmp="$DONE_MARKER.tmp.$BASHPID"
      mkdir -p -- "${DONE_MARKER%/*}" && printf '%s\n' "$text" >"$tmp" &&
        mv -f -- "$tmp" "$DONE_MARKER"
      ;;
  esac
}

# The zone the run is claimed for (zone_policy first-active), into CLAIMED: 0 claimed, 1 no
# claim yet, 2 it could not tell.
# shellcheck disable=SC2317 # called through with_retries
zone_claim_read() {
  local out rc=0
  CLAIMED=""
  case $ZONE_CLAIM in
    gs://*)
      gcs_tool "$ZONE_CLAIM" || return 2
      out=$("${GCS[@]}" cat -- "$ZONE_CLAIM" 2>&1) || rc=$?
      if ((rc != 0)); then
        if absent "$out"; then return 1; fi
        LOOKUP_ERROR="cannot read $ZONE_CLAIM: ${out//$'\n'/ }"
        return 2
      fi
      ;;
    *)
      [[ -e $ZONE_CLAIM ]] || return 1
      if ! out=$(<"$ZONE_CLAIM"); then
        LOOKUP_ERROR="cannot read $ZONE_CLAIM"
        return 2
      fi
      ;;
  esac
  CLAIMED=${out%%$'\n'*}
}

# The highest committed step under the checkpoint root: on Cloud Storage a step folder with
# commit_success.txt (Orbax adds it last), on a disk any step folder (a save in progress has a
# tmp name and is renamed when committed). Prints nothing when there is none.
latest_committed_step() {
  local best="" path step listing rc=0
  case $CHECKPOINT_ROOT in
    gs://*)
      listing=$(with_retries gcs_lookup list "$CHECKPOINT_ROOT/*/commit_success.txt") || rc=$?
      ((rc != 2)) || return 2
      ((rc == 0)) || listing=""
      while IFS= read -r path; do
        path=${path%/commit_success.txt}
        [[ ${path##*/} =~ $STEP_NAME ]] || continue
        step=$((10#${BASH_REMATCH[2]}))
        if [[ -z $best ]] || ((step > best)); then best=$step; fi
      done <<<"$listing"
      ;;
    "") ;;
    *)
      for path in "$CHECKPOINT_ROOT"/*/; do
        path=${path%/}
        [[ -d $path && ${path##*/} =~ $STEP_NAME ]] || continue
        step=$((10#${BASH_REMATCH[2]}))
        if [[ -z $best ]] || ((step > best)); then best=$step; fi
      done
      ;;
  esac
  printf '%s' "$best"
}

# ----------------------------------------------------------------------------------------------
# 1. One startup run at a time, and never a second trainer: the lock is held by the supervisor
#    and the trainer for as long as either lives.
mkdir -p "$TPUCTL_DIR" "$STATE_DIR" "$LOG_DIR"
exec 9>>"$TPUCTL_DIR/startup.lock"
if ! flock -n 9; then
  log "another tpuctl startup run or trainer holds $TPUCTL_DIR/startup.lock; nothing to do"
  exit 0
fi

# Boots are counted; tpuctl running the script again in the same boot (after uploading the code,
# or to restart the job: TPUCTL_STARTUP_RERUN=1) is not a new one and shares its log.
BOOT=""
{ read -r BOOT <"$STATE_DIR/boot"; } 2>/dev/null || true
[[ $BOOT =~ ^[0-9]+$ ]] || BOOT=0
RUN_KIND=boot
if [[ ${TPUCTL_STARTUP_RERUN:-} == 1 ]] && ((BOOT > 0)); then
  RUN_KIND="rerun in boot"
else
  BOOT=$((BOOT + 1))
  printf '%s\n' "$BOOT" >"$STATE_DIR/.boot.tmp" && mv -f "$STATE_DIR/.boot.tmp" "$STATE_DIR/boot"
fi
BOOT_LOG="$LOG_DIR/boot-$BOOT.log"
: >>"$BOOT_LOG"
ln -sfn "boot-$BOOT.log" "$LOG_DIR/current.log"
# A job launched in this boot is launched once: tpuctl running the script again (a delivery, a
# second `tpuctl up`) after the job ended by itself must not run it twice (an export, an
# upload, an append would happen twice). Only a restart (TPUCTL_STARTUP_RESTART=1), or a stop
# by `tpuctl stop` in this boot, lets it launch again; its status stays as the job left it.
if [[ $RUN_KIND != boot && ${TPUCTL_STARTUP_RESTART:-} != 1 ]]; then
  LAUNCHED_IN="" STOPPED_IN=""
  { read -r LAUNCHED_IN <"$STATE_DIR/launched"; } 2>/dev/null || true
  { read -r STOPPED_IN <"$STATE_DIR/stopped"; } 2>/dev/null || true
  if [[ $LAUNCHED_IN == "$BOOT" && $STOPPED_IN != "$BOOT" ]]; then
    log "$RUN_KIND $BOOT of run $RUN_NAME: the job was launched in this boot already and" \
      "ended; not launching it again (tpuctl restart relaunches it)"
    exit 0
  fi
fi
write_status
log "$RUN_KIND $BOOT of run $RUN_NAME (spec $SPEC_NAME," \
  "framework $FRAMEWORK, autocheckpoint $AUTOCHECKPOINT)"

# 1b. The spec's own boot steps (job.boot_script), as root, before anything of tpuctl's.
if [[ -n $BOOT_SCRIPT ]]; then
  log "running job.boot_script"
  rc=0
  bash -c "$BOOT_SCRIPT" 9>&- >>"$BOOT_LOG" 2>&1 </dev/null || rc=$?
  ((rc == 0)) || fail_setup "job.boot_script exited with $rc"
fi

# 2. The user, rebuilt on every boot: after a repair the disk is new.
STATUS_STATE=setup
write_status
AS_USER=()
if [[ -n $VM_ROOT ]]; then
  JOB_HOME="$VM_ROOT/home/$JOB_USER"
  mkdir -p "$JOB_HOME"
else
  if ! id -u -- "$JOB_USER" >/dev/null 2>&1; then
    log "creating user $JOB_USER"
    useradd -m -s /bin/bash -- "$JOB_USER"
  fi
  JOB_HOME=$(getent passwd -- "$JOB_USER" | cut -d: -f6)
  JOB_UID=$(id -u -- "$JOB_USER")
  JOB_GID=$(id -g -- "$JOB_USER")
  if ((JOB_UID != 0)); then
    # setpriv execs in place; runuser forks and SIGKILLs its child 2 s after a SIGTERM, which
    # would cut an autocheckpoint save short, so it is only the fallback.
    if command -v setpriv >/dev/null; then
      AS_USER=(setpriv "--reuid=$JOB_UID" "--regid=$JOB_GID" --init-groups --)
    else
      AS_USER=(runuser -u "$JOB_USER" --)
    fi
    # The job may create the done marker in the state dir.
    chgrp -- "$JOB_GID" "$STATE_DIR" && chmod 0775 "$STATE_DIR"
  fi
fi

resolve_path "$WORKDIR_SPEC"
WORKDIR=$RESOLVED
if ! "${AS_USER[@]}" mkdir -p -- "$WORKDIR" 2>/dev/null; then
  mkdir -p -- "$WORKDIR"
  if ((${#AS_USER[@]})); then chown -- "$JOB_UID:$JOB_GID" "$WORKDIR"; fi
fi
resolve_shared_path "$CHECKPOINT_DIR_SPEC"
CHECKPOINT_DIR=$RESOLVED
case $CHECKPOINT_DIR in
  gs://*) ;;
  *) "${AS_USER[@]}" mkdir -p -- "$CHECKPOINT_DIR" || log "warning: cannot create it now" ;;
esac
if [[ -n $DONE_MARKER_SPEC ]]; then
  resolve_shared_path "$DONE_MARKER_SPEC"
  DONE_MARKER=$RESOLVED
  resolve_shared_path "$CHECKPOINT_ROOT_SPEC"
  CHECKPOINT_ROOT=$RESOLVED
  # The job writes the marker itself when it finishes.
  case $DONE_MARKER in
    gs://*) ;;
    *) "${AS_USER[@]}" mkdir -p -- "${DONE_MARKER%/*}" || log "warning: cannot create it now" ;;
  esac
fi

# 3. A finished run stays finished. Only the marker says so: MaxText exits 0 after an on-demand
#    checkpoint and Pax exits 1, so an exit code means nothing.
DONE_RC=0
done_marker_exists || DONE_RC=$?
if ((DONE_RC == 0)); then
  STATUS_STATE="done"
  write_status
  log "done marker $DONE_MARKER exists; not relaunching"
  exit 0
elif ((DONE_RC == 2)); then
  fail_setup "cannot tell whether the job is done, so it is not relaunched: $LOOKUP_ERROR"
fi

# 4. Who this worker is, from the metadata server. A Cloud TPU VM and a Compute Engine TPU VM
#    say it differently: tpu-env's WORKER_ID / ACCELERATOR_TYPE are TPU_-prefixed on Compute
#    Engine, and its worker-network-endpoints are instance names, not `n:unknown:IP` triples.
TPU_ENV=$(metadata tpu-env) || TPU_ENV=""
WORKER_ID=$(metadata agent-worker-number) || tpu_env_value WORKER_ID TPU_WORKER_ID
[[ -n $WORKER_ID ]] ||
  fail_setup "cannot read agent-worker-number (nor tpu-env's TPU_WORKER_ID) from $METADATA_URL"
ENDPOINTS=$(metadata worker-network-endpoints) || ENDPOINTS=""
tpu_env_value NODE_ID NODE_ID
tpu_env_value ACCELERATOR_TYPE ACCELERATOR_TYPE
[[ -n $ACCELERATOR_TYPE ]] || tpu_env_value ACCELERATOR_TYPE TPU_ACCELERATOR_TYPE
[[ -n $ACCELERATOR_TYPE ]] || ACCELERATOR_TYPE=$(metadata accelerator-type) || ACCELERATOR_TYPE=""
tpu_env_value MEGASCALE_COORDINATOR_ADDRESS MEGASCALE_COORDINATOR_ADDRESS
tpu_env_value MEGASCALE_NUM_SLICES MEGASCALE_NUM_SLICES
tpu_env_value MEGASCALE_SLICE_ID MEGASCALE_SLICE_ID
tpu_env_value TPU_ENV_WORKER_ID WORKER_ID
[[ -n $TPU_ENV_WORKER_ID ]] || tpu_env_value TPU_ENV_WORKER_ID TPU_WORKER_ID
if [[ -n $TPU_ENV_WORKER_ID && $TPU_ENV_WORKER_ID != "$WORKER_ID" ]]; then
  log "warning: tpu-env WORKER_ID=$TPU_ENV_WORKER_ID differs from agent-worker-number=$WORKER_ID"
fi
SLICE_ID=${MEGASCALE_SLICE_ID:-0}
NUM_SLICES=${MEGASCALE_NUM_SLICES:-1}
IFS=, read -r -a ENDPOINT_LIST <<<"$ENDPOINTS"
WORKERS_PER_SLICE=${#ENDPOINT_LIST[@]}
((WORKERS_PER_SLICE > 0)) || WORKERS_PER_SLICE=1
for number in "$WORKER_ID" "$SLICE_ID" "$NUM_SLICES"; do
  [[ $number =~ ^[0-9]+$ ]] || fail_setup "metadata gave a non-numeric worker/slice id: '$number'"
done
# JAX's coordinator is worker 0 on port 8476; across slices that is slice 0's worker 0, which
# MEGASCALE_COORDINATOR_ADDRESS names (the first endpoint of this slice would differ per slice).
FIRST_ENDPOINT=${ENDPOINT_LIST[0]:-}
if [[ $FIRST_ENDPOINT == *:* ]]; then
  IFS=: read -r _ _ FIRST_IP _ <<<"$FIRST_ENDPOINT" || true
else
  FIRST_IP=$(host_address "$FIRST_ENDPOINT") || FIRST_IP=""
  [[ -n $FIRST_IP || -z $FIRST_ENDPOINT ]] || log "warning: cannot resolve $FIRST_ENDPOINT"
fi
COORDINATOR_HOST=${FIRST_IP:-127.0.0.1}
# A Compute Engine TPU VM (its tpu-env says TPU_WORKER_ID): no Autocheckpoint there.
ON_COMPUTE_ENGINE=0
tpu_env_value COMPUTE_WORKER_ID TPU_WORKER_ID
[[ -n $COMPUTE_WORKER_ID ]] && ON_COMPUTE_ENGINE=1
if ((MULTISLICE)) && [[ -n $MEGASCALE_COORDINATOR_ADDRESS ]]; then
  COORDINATOR_HOST=${MEGASCALE_COORDINATOR_ADDRESS%:*}
fi
log "worker $WORKER_ID of slice $SLICE_ID/$NUM_SLICES (node ${NODE_ID:-?}, ${ACCELERATOR_TYPE:-?})"
if [[ -n $WORKER_STATES_SPEC ]]; then
  resolve_shared_path "$WORKER_STATES_SPEC"
  WORKER_STATE="$RESOLVED/$SLICE_ID-$WORKER_ID.json"
  write_shared_state
fi

# 4b. A run queued in several zones at once (zone_policy first-active) runs only in the zone
#     tpuctl chose for it and claimed beside the checkpoints (the first whose queued resource
#     became ACTIVE). Anywhere else nothing is launched: tpuctl deletes those workers, or
#     claims their zone and runs this script again. A claim it cannot read launches nothing.
if [[ -n $ZONE_CLAIM_SPEC ]]; then
  resolve_shared_path "$ZONE_CLAIM_SPEC"
  ZONE_CLAIM=$RESOLVED
  tpu_env_value OWN_ZONE ZONE
  [[ -n $OWN_ZONE ]] || fail_setup "tpu-env has no ZONE: cannot check the zone claim"
  CLAIMED="" CLAIM_RC=0
  with_retries zone_claim_read || CLAIM_RC=$?
  if ((CLAIM_RC == 2)); then
    fail_setup "cannot tell which zone the run is claimed for, so nothing is launched: $LOOKUP_ERROR"
  fi
  if [[ $CLAIMED != "$OWN_ZONE" ]]; then
    STATUS_STATE=waiting-for-zone
    REASON="the run is claimed for ${CLAIMED:-no zone yet}, not $OWN_ZONE: launching nothing"
    write_status
    log "$REASON"
    exit 0
  fi
  log "the run is claimed for this zone ($OWN_ZONE)"
fi
# JAX's view of this host (and Pax's --host_idx/--num_hosts/--server_addr on Multislice).
PROCESS_ID=$((WORKER_ID + SLICE_ID * WORKERS_PER_SLICE))
NUM_PROCESSES=$((WORKERS_PER_SLICE * NUM_SLICES))
COORDINATOR_ADDRESS="$COORDINATOR_HOST:8476"

# SIGINT is ignored in background jobs of a script; give the job the default back when env can.
ENV_RESET=()
if env --default-signal=INT true 2>/dev/null; then ENV_RESET=(--default-signal=INT); fi
JOB_ENVIRONMENT=(
  "HOME=$JOB_HOME" "USER=$JOB_USER" "LOGNAME=$JOB_USER" "PATH=$JOB_HOME/.local/bin:$PATH"
  "TPUCTL_RUN_NAME=$RUN_NAME" "TPUCTL_CHECKPOINT_DIR=$CHECKPOINT_DIR"
  "TPUCTL_DONE_MARKER=$DONE_MARKER" "TPUCTL_BOOT=$BOOT" "TPUCTL_AUTOCHECKPOINT=$AUTOCHECKPOINT"
  "TPUCTL_WORKER_ID=$WORKER_ID" "TPUCTL_SLICE_ID=$SLICE_ID" "TPUCTL_NUM_SLICES=$NUM_SLICES"
  "TPUCTL_WORKERS_PER_SLICE=$WORKERS_PER_SLICE"
  "TPUCTL_PROCESS_ID=$PROCESS_ID" "TPUCTL_NUM_PROCESSES=$NUM_PROCESSES"
  "TPUCTL_COORDINATOR_ADDRESS=$COORDINATOR_ADDRESS"
)
if [[ -n $TARGET_STEP ]]; then JOB_ENVIRONMENT+=("TPUCTL_TARGET_STEP=$TARGET_STEP"); fi
if ((MULTISLICE)); then
  JOB_ENVIRONMENT+=(
    "MEGASCALE_COORDINATOR_ADDRESS=$MEGASCALE_COORDINATOR_ADDRESS"
    "MEGASCALE_NUM_SLICES=$NUM_SLICES" "MEGASCALE_SLICE_ID=$SLICE_ID"
  )
fi
JOB_ENVIRONMENT+=("${JOB_ENV[@]}") # the spec's own env last, so it can override

# Runs "$@" as the job user, in the workdir, with the job's environment.
as_job_user() {
  (cd -- "$WORKDIR" && exec "${AS_USER[@]}" env "${ENV_RESET[@]}" "${JOB_ENVIRONMENT[@]}" "$@")
}

# 5. The code.
case $CODE in
  "") log "no job.code: running in $WORKDIR as it is" ;;
  gs://*)
    ARCHIVE="$STATE_DIR/code.download"
    log "fetching $CODE"
    if command -v gcloud >/dev/null; then
      gcloud storage cp -- "$CODE" "$ARCHIVE" >>"$BOOT_LOG" 2>&1 || fail_setup "cannot fetch $CODE"
    else
      gsutil -q cp -- "$CODE" "$ARCHIVE" >>"$BOOT_LOG" 2>&1 || fail_setup "cannot fetch $CODE"
    fi
    chmod 0644 "$ARCHIVE"
    as_job_user tar -xzf "$ARCHIVE" -C "$WORKDIR" 9>&- >>"$BOOT_LOG" 2>&1 </dev/null \
      || fail_setup "cannot unpack $CODE into $WORKDIR"
    ;;
  *)
    # A local directory is shipped by tpuctl over SSH once the worker is up, so on a first boot
    # (or a repaired worker's new disk) it is not here yet. The upload ends by creating the
    # marker and running this script again; until then there is nothing to launch.
    if [[ ! -e $WORKDIR/$CODE_READY_MARKER ]]; then
      STATUS_STATE=waiting-for-code
      REASON="job.code is local: waiting for tpuctl to upload it to $WORKDIR"
      write_status
      log "$REASON (the upload runs this script again)"
      exit 0
    fi
    log "job.code is local ($CODE): using the upload in $WORKDIR"
    ;;
esac

# 6. Setup commands, in order; the first failure stops the launch. The lock's descriptor is
#    closed for them so a daemon they leave behind cannot hold it.
for index in "${!SETUP_COMMANDS[@]}"; do
  log "setup $((index + 1))/${#SETUP_COMMANDS[@]}"
  rc=0
  as_job_user bash -c "${SETUP_COMMANDS[index]}" 9>&- >>"$BOOT_LOG" 2>&1 </dev/null || rc=$?
  ((rc == 0)) || fail_setup "setup command $((index + 1)) exited with $rc"
done

# 7. Free the TPU: whatever a previous boot left holding the devices, and libtpu's lockfile
#    ("TPU in use" otherwise).
shopt -s nullglob
DEVICES=("$VM_ROOT"/dev/accel* "$VM_ROOT"/dev/vfio/*)
shopt -u nullglob
if ((${#DEVICES[@]})) && command -v fuser >/dev/null; then
  fuser -s -k "${DEVICES[@]}" 9>&- || true
fi
rm -f -- "$VM_ROOT/tmp/libtpu_lockfile"

# 8. Launch. The framework's flags go where the command says {flags}, else at its end; the
#    line as launched is kept private (it may hold tokens). On a VM with systemd the trainer is
#    a transient unit, so a graceful shutdown (spot soft-off, reboot, maintenance) stops it
#    with SIGTERM while the network is still up and waits the grace for its save; elsewhere it
#    gets its own session. A supervisor forwards SIGTERM/SIGINT, keeps the heartbeat and
#    records the exit.
preset_args
FLAGS=""
if ((${#PRESET_ARGS[@]})); then FLAGS=$(printf '%q ' "${PRESET_ARGS[@]}"); fi
FLAGS=${FLAGS% }
if [[ $JOB_COMMAND == *"{flags}"* ]]; then
  JOB_COMMAND=${JOB_COMMAND//\{flags\}/$FLAGS}
elif [[ -n $FLAGS ]]; then
  JOB_COMMAND+=" $FLAGS"
fi
(umask 077 && printf '%s' "$JOB_COMMAND" >"$STATE_DIR/command")
printf '%s\n' "$BOOT" >"$STATE_DIR/.launched.tmp" && mv -f "$STATE_DIR/.launched.tmp" "$STATE_DIR/launched"
UNIT=""
if [[ -d $VM_ROOT/run/systemd/system ]] && command -v systemd-run >/dev/null; then
  UNIT="tpuctl-$RUN_NAME-boot$BOOT"
fi
trap - ERR

# The trainer as a transient unit: KillMode=mixed (SIGTERM to the trainer, what is left is
# killed after the stop timeout), the platform's grace as that timeout, ordered after the
# network so it stops before the network does, and a high open-files limit.
start_unit() {
  local as=()
  if ((${#AS_USER[@]})); then as=("--uid=$JOB_UID" "--gid=$JOB_GID"); fi
  systemd-run --unit="$UNIT" --wait --collect --quiet --service-type=exec \
    "--property=KillMode=mixed" "--property=TimeoutStopSec=$GRACE_SECONDS" \
    "--property=After=network-online.target" "--property=Wants=network-online.target" \
    "--property=LimitNOFILE=$NOFILE_LIMIT" \
    "--property=StandardOutput=append:$BOOT_LOG" "--property=StandardError=append:$BOOT_LOG" \
    "--working-directory=$WORKDIR" "${as[@]}" \
    -- env "${ENV_RESET[@]}" "${JOB_ENVIRONMENT[@]}" bash -lc "$JOB_COMMAND"
}

# The unit's main pid once it has one (systemd's own session: it leads its process group).
unit_pid() {
  local tries pid=""
  for ((tries = 0; tries < 200; tries++)); do
    pid=$(systemctl show -p MainPID --value "$UNIT" 2>/dev/null) || pid=""
    if [[ $pid =~ ^[1-9][0-9]*$ ]]; then
      printf '%s' "$pid"
      return 0
    fi
    sleep 0.05
  done
  return 1
}

# The supervisor's view of the done marker after the trainer exited: done, not done, or (a
# lookup that kept failing) unknown, said in the status rather than read as "not done".
settle_done_state() {
  local rc=0
  done_marker_exists || rc=$?
  case $rc in
    0) STATUS_STATE="done" ;;
    1) STATUS_STATE=exited ;;
    *)
      STATUS_STATE=exited
      REASON="cannot tell whether the job is done: $LOOKUP_ERROR"
      ;;
  esac
}

# The end of the run, ahead of time: the supervisor is sent the SIGTERM it forwards to the
# trainer (the one Autocheckpoint gives), RUN_END_LEAD_SECONDS before the platform takes the
# VM back, so the trainer's save commits first. The time is read again every minute (a
# reservation's window can move); an emulated VM's lead is scaled by TPUCTL_EMULATOR_SPEED
# (its metadata serves real time), a real VM has none.
watch_run_end() {
  local supervisor=$1 end now lead wake speed=${TPUCTL_EMULATOR_SPEED:-1}
  lead=$(awk -v lead="$RUN_END_LEAD_SECONDS" -v speed="$speed" \
    'BEGIN { if (speed + 0 <= 0) speed = 1; printf "%d", lead / speed + 0.5 }')
  end=$(termination_epoch) || return 0
  log "the platform takes this VM back at $(date -u -d "@$end" +%Y-%m-%dT%H:%M:%SZ): the" \
    "trainer gets SIGTERM ${lead}s before"
  while kill -0 "$supervisor" 2>/dev/null; do
    now=$(date +%s)
    if ((now >= end - lead)); then
      log "the run ends in $((end - now))s: stopping the trainer so it saves first"
      kill -s TERM "$supervisor" 2>/dev/null
      return 0
    fi
    wake=$((end - lead - now))
    sleep "$((wake < 60 ? wake : 60))"
    end=$(termination_epoch) || return 0
  done
}

# On Compute Engine there is no Autocheckpoint: the platform's own notices, read from the
# metadata server, give the trainer the same SIGTERM (through the supervisor, as above) so it
# saves: a spot preemption (instance/preempted TRUE), host maintenance under way
# (instance/maintenance-event not NONE), or announced (instance/upcoming-maintenance, whose
# window_start_time is treated as the run's end: SIGTERM RUN_END_LEAD_SECONDS before). Read
# every PLATFORM_POLL_SECONDS (÷ the emulator's speed); once, then it is done.
watch_platform() {
  local supervisor=$1 base=${METADATA_URL%/attributes} lead pause speed=${TPUCTL_EMULATOR_SPEED:-1}
  local text reason start now
  lead=$(awk -v lead="$RUN_END_LEAD_SECONDS" -v speed="$speed" \
    'BEGIN { if (speed + 0 <= 0) speed = 1; printf "%d", lead / speed + 0.5 }')
  pause=$(awk -v pause="$PLATFORM_POLL_SECONDS" -v speed="$speed" \
    'BEGIN { if (speed + 0 <= 0) speed = 1; p = pause / speed; if (p < 1) p = 1; printf "%d", p }')
  while kill -0 "$supervisor" 2>/dev/null; do
    reason=""
    text=$(platform_value "$base/preempted") || text=""
    [[ $text == TRUE ]] && reason="the VM is preempted"
    text=$(platform_value "$base/maintenance-event") || text=""
    [[ -z $reason && -n $text && $text != NONE ]] && reason="host maintenance ($text)"
    if [[ -z $reason ]] && text=$(platform_value "$base/upcoming-maintenance"); then
      text=${text#*\"window_start_time\"}
      text=${text#*\"}
      start=$(date -u -d "${text%%\"*}" +%s 2>/dev/null) || start=""
      now=$(date +%s)
      if [[ -n $start ]] && ((now >= start - lead)); then
        reason="host maintenance at $(date -u -d "@$start" +%Y-%m-%dT%H:%M:%SZ)"
      fi
    fi
    if [[ -n $reason ]]; then
      log "$reason: stopping the trainer so it saves first"
      kill -s TERM "$supervisor" 2>/dev/null
      return 0
    fi
    sleep "$pause"
  done
}

platform_value() {
  curl -fsS --connect-timeout 2 --max-time 5 -H 'Metadata-Flavor: Google' "$1" 2>/dev/null
}

supervise() {
  set +e
  LOG_TO_STDERR=0 # stderr is the boot log already
  local supervisor=$BASHPID heartbeat_pid run_end_pid platform_pid="" rc previous="" launcher
  SIGNALLED=0
  if [[ -n $UNIT ]]; then
    start_unit </dev/null >>"$BOOT_LOG" 2>&1 9>&- &
    launcher=$!
    TRAINER_PID=$(unit_pid) || TRAINER_PID=$launcher
  else
    (
      cd -- "$WORKDIR" &&
        exec setsid "${AS_USER[@]}" env "${ENV_RESET[@]}" "${JOB_ENVIRONMENT[@]}" \
          bash -c "$JOB_COMMAND"
    ) </dev/null >>"$BOOT_LOG" 2>&1 &
    launcher=$!
    TRAINER_PID=$launcher
  fi
  # shellcheck disable=SC2317 # called by forward
  trainer_alive() { # running, not a zombie awaiting our wait
    local stat
    { stat=$(<"/proc/$TRAINER_PID/stat"); } 2>/dev/null || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
  }
  # shellcheck disable=SC2317 # called by the TERM and INT traps
  forward() {
    signalled=1
    if ! trainer_alive; then
      log "SIG$1 after the trainer had exited: nothing to forward"
      return 0
    fi
    SIGNALLED=1
    REASON="forwarded SIG$1"
    log "forwarding SIG$1 to the trainer (process group $TRAINER_PID)"
    if [[ -n $UNIT ]]; then
      systemctl kill --signal="SIG$1" "$UNIT" 2>/dev/null && return 0
    fi
    kill -s "$1" -- "-$TRAINER_PID" 2>/dev/null || kill -s "$1" "$TRAINER_PID" 2>/dev/null
  }
  trap 'forward TERM' TERM
  trap 'forward INT' INT
  # setsid makes the trainer lead its own process group in the child, a moment after the fork:
  # wait for that (2 s at most), so the pid in the status file names a group one can signal.
  local tries stat pgrp="" signalled=0
  for ((tries = 0; tries < 200; tries++)); do
    { stat=$(<"/proc/$TRAINER_PID/stat"); } 2>/dev/null || break
    read -r _ _ pgrp _ <<<"${stat##*) }"
    [[ $pgrp == "$TRAINER_PID" ]] && break
    sleep 0.01
  done
  TZ=UTC printf -v STARTED '%(%Y-%m-%dT%H:%M:%SZ)T' -1
  STATUS_STATE=running
  write_status
  log "trainer started as pid $TRAINER_PID${UNIT:+ in unit $UNIT}"
  (
    # The supervisor's TERM ends this between two writes, never in one: an `mv` of a status
    # still saying "running" that lands after the supervisor's last write would say so for
    # ever. Bash runs the trap once its foreground command (that mv) is over; the sleep is
    # waited for in the background, so the trap ends it at once.
    sleeper=""
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    shared_at=$SECONDS
    while kill -0 "$launcher" 2>/dev/null && kill -0 "$supervisor" 2>/dev/null; do
      sleep "$HEARTBEAT_SECONDS" &
      sleeper=$!
      wait "$sleeper"
      read_last_step
      write_status
      if ((SECONDS - shared_at >= STATE_HEARTBEAT_SECONDS)); then
        shared_at=$SECONDS
        write_shared_state force
      fi
    done
  ) 9>&- &
  heartbeat_pid=$!
  watch_run_end "$supervisor" 9>&- &
  run_end_pid=$!
  if ((ON_COMPUTE_ENGINE)); then
    watch_platform "$supervisor" 9>&- &
    platform_pid=$!
  fi
  # A trapped signal makes `wait` return early while the trainer still runs: wait again. No
  # deadline of our own: the grace period is the platform's.
  while :; do
    signalled=0
    rc=0
    wait "$launcher" || rc=$?
    ((signalled)) || break
    previous=$rc
  done
  # 127: the status was collected by the wait a late signal interrupted.
  if ((rc == 127)) && [[ -n $previous ]]; then rc=$previous; fi
  # The watcher holds no lock: it is not waited for (its metadata read may take seconds). The
  # heartbeat is, to the end of a write it was in: this shell's writes come after its last
  # (again after a signal this shell traps cut a wait short).
  kill "$heartbeat_pid" "$run_end_pid" $platform_pid 2>/dev/null
  for _ in 1 2 3; do
    wait "$heartbeat_pid" 2>/dev/null
    kill -0 "$heartbeat_pid" 2>/dev/null || break
  done
  EXIT_CODE=$rc
  read_last_step
  # With target_step, the checkpoints say whether the job has finished: record it for good.
  local done_rc=0
  done_marker_exists || done_rc=$?
  if [[ -n $TARGET_STEP ]] && ((done_rc == 1)); then
    local latest="" list_rc=0
    latest=$(latest_committed_step) || list_rc=$?
    if ((list_rc != 0)); then
      log "warning: cannot list the committed checkpoints: $LOOKUP_ERROR"
    elif [[ -n $latest ]] && ((latest >= TARGET_STEP)); then
      if write_done_marker "committed step $latest >= target_step $TARGET_STEP (exit $rc," \
        "boot $BOOT, slice $SLICE_ID worker $WORKER_ID)"; then
        log "committed step $latest reached target_step $TARGET_STEP: wrote $DONE_MARKER"
      else
        log "warning: cannot write the done marker $DONE_MARKER"
      fi
    else
      log "latest committed step ${latest:-none} is below target_step $TARGET_STEP"
    fi
  fi
  settle_done_state
  # Said, and the lock let go, before the status says so: whoever reads the new status can
  # run this script again at once and find the log complete.
  log "trainer exited with $rc; state $STATUS_STATE"
  exec 9>&-
  write_status
}

supervise </dev/null >>"$BOOT_LOG" 2>&1 &
log "supervisor started as pid $!; output in $BOOT_LOG"
exit 0
