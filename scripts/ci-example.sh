#!/usr/bin/env bash
# A CI job's use of tpuctl: create and wait (deadlines from the spec), check it, clean up.
#
#   scripts/ci-example.sh SPEC
#
# Project and zone come from the spec, --project/--zone, TPUCTL_PROJECT/TPUCTL_ZONE or gcloud's
# configuration; TPU_EMULATOR_HOST points everything at the local emulator. TPUCTL overrides the
# command (e.g. TPUCTL="python -m tpuctl"). Exit codes are tpuctl's own, so the CI system can
# tell "no capacity in time" (4) from "the queued resource FAILED" (6) and "preempted" (7).
set -euo pipefail

spec="${1:?usage: ci-example.sh SPEC}"
read -r -a tpuctl <<<"${TPUCTL:-tpuctl}"

# Whatever happens below (a failed check, a cancelled job), leave no queued resource behind.
# `create --wait` already deletes what it gives up on at a deadline; this covers the rest.
cleanup() {
  "${tpuctl[@]}" delete "$spec" --force --yes --ignore-missing >/dev/null || true
}
trap cleanup EXIT

echo "== create and wait" >&2
set +e
"${tpuctl[@]}" create "$spec" --wait --format json >create.json
rc=$?
set -e
case "$rc" in
  0) ;;
  4) echo "no capacity within the deadline: tpuctl deleted the request; retry later" >&2; exit 4 ;;
  6) echo "the queued resource FAILED (see create.json); not retrying" >&2; exit 6 ;;
  7) echo "preempted before it was ready; retry" >&2; exit 7 ;;
  *) echo "tpuctl create failed with exit code $rc" >&2; exit "$rc" ;;
esac

echo "== status" >&2
"${tpuctl[@]}" status "$spec" --format json >status.json
state="$(python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])' <status.json)"
workers="$(python3 -c '
import json, sys
status = json.load(sys.stdin)
print(sum(len(node["workers"]) for node in status["nodes"]))' <status.json)"
if [[ "$state" != "ACTIVE" ]]; then
  echo "expected ACTIVE, got $state" >&2
  exit 1
fi
if [[ "$workers" -lt 1 ]]; then
  echo "ACTIVE but no workers listed" >&2
  exit 1
fi
echo "ACTIVE with $workers worker(s)" >&2

# … the job's own steps go here (tpuctl run / upload / logs) …

echo "== delete" >&2
"${tpuctl[@]}" delete "$spec" --force --yes --format json >delete.json
action="$(python3 -c 'import json, sys; print(json.load(sys.stdin)["action"])' <delete.json)"
if [[ "$action" != "deleted" ]]; then
  echo "delete ended with $action" >&2
  exit 1
fi
trap - EXIT
echo "ok" >&2
