"""A compute plan (tpuctl.render.compute) as gcloud command lines, one a request, read from
the rendered bodies so the two never disagree.

Each command uses the lowest gcloud track that has every flag it needs (read from gcloud
528's `--help`): GA has no FLEX_START provisioning model (alpha has it), no graceful shutdown
(beta has it) and no MIG target size policy (alpha has it). What no track has a flag for
(flex-start's queueing window, the MIG's action on failure, a confidential-compute boot disk)
is said in comment lines above the command: `tpuctl create` sends those through the API.
"""

from __future__ import annotations

import shlex
from datetime import timedelta
from typing import Any

from tpuctl.render.compute import ComputePlan, ComputeRequest
from tpuctl.render.gcloud import (
    STARTUP_SCRIPT_FILE,
    _gcloud_dict,
    _gcloud_list,
    gcloud_duration,
)
from tpuctl.render.request import STARTUP_SCRIPT_KEY

_TRACK_ORDER = ("", "beta", "alpha")


class _Line:
    """One command being written: its words, the track it needs, what it cannot say."""

    def __init__(self, command: str, name: str, scope: dict[str, str]) -> None:
        self.command = command
        self.words: list[str] = [f"--project={scope['project']}"]
        self.words += [f"--{key}={value}" for key, value in scope.items() if key != "project"]
        self.name = name
        self.track = ""
        self.notes: list[str] = []

    def needs(self, track: str, why: str) -> None:
        """A flag only `track` has: the command moves there, saying why."""
        if _TRACK_ORDER.index(track) > _TRACK_ORDER.index(self.track):
            self.track = track
        self.notes.append(f"{why}: gcloud {track} has it, GA does not")

    def unsaid(self, field: str, value: str) -> None:
        self.notes.append(
            f"no gcloud flag for {field} ({value}): tpuctl create sends it through the API"
        )

    def text(self) -> str:
        track = f"{self.track} " if self.track else ""
        head = f"gcloud {track}compute {self.command} {shlex.quote(self.name)}"
        comments = "".join(f"# {note}\n" for note in self.notes)
        return comments + " \\\n    ".join([head, *(shlex.quote(w) for w in self.words)]) + "\n"


def render_compute_gcloud(plan: ComputePlan) -> str:
    """The plan's requests as gcloud commands, in order, a blank line between them."""
    return "\n".join(_command(request).text() for request in plan.requests)


def _command(request: ComputeRequest) -> _Line:
    body = request.body
    if request.resource == "instances":
        line = _Line("instances create", body["name"], request.scope)
        line.words.append(f"--machine-type={body['machineType'].rsplit('/', 1)[-1]}")
        _vm_flags(line, body)
        window = body.get("params", {}).get("requestValidForDuration")
        if window is not None:
            line.unsaid("params.requestValidForDuration", _seconds(window))
        return line
    if request.resource == "instanceTemplates":
        line = _Line("instance-templates create", body["name"], request.scope)
        properties = body["properties"]
        line.words.append(f"--machine-type={properties['machineType']}")
        _vm_flags(line, properties)
        return line
    if request.resource == "resourcePolicies":
        line = _Line("resource-policies create workload-policy", body["name"], request.scope)
        policy = body["workloadPolicy"]
        line.words += [
            f"--type={policy['type']}",
            f"--accelerator-topology={policy['acceleratorTopology']}",
        ]
        return line
    return _group(request)


def _group(request: ComputeRequest) -> _Line:
    body = request.body
    line = _Line("instance-groups managed create", body["name"], request.scope)
    line.words += [
        f"--template={body['instanceTemplate']}",
        f"--size={body['targetSize']}",
        f"--base-instance-name={body['baseInstanceName']}",
        f"--workload-policy={body['resourcePolicies']['workloadPolicy']}",
    ]
    mode = body["targetSizePolicy"]["mode"]
    line.words.append(f"--target-size-policy-mode={mode.lower()}")
    line.needs("alpha", "--target-size-policy-mode")
    action = body["instanceLifecyclePolicy"]["defaultActionOnFailure"]
    line.unsaid("instanceLifecyclePolicy.defaultActionOnFailure", action)
    return line


def _vm_flags(line: _Line, vm: dict[str, Any]) -> None:
    """Flags of an instance or a template's properties (the fields they share)."""
    _disk_flags(line, vm["disks"])
    _network_flags(line, vm["networkInterfaces"][0])
    _scheduling_flags(line, vm["scheduling"])
    affinity = vm.get("reservationAffinity")
    if affinity is not None:
        line.words += ["--reservation-affinity=specific", f"--reservation={affinity['values'][0]}"]
    if vm.get("tags"):
        line.words.append(f"--tags={_gcloud_list(vm['tags']['items'])}")
    line.words.append(f"--labels={_gcloud_dict(vm['labels'])}")
    account = vm["serviceAccounts"][0]
    if account["email"] != "default":  # gcloud's own default when the flag is left out
        line.words.append(f"--service-account={account['email']}")
    line.words.append(f"--scopes={_gcloud_list(account['scopes'])}")
    metadata = {item["key"]: item["value"] for item in vm["metadata"]["items"]}
    # The script itself is long; it travels as a file (startup.sh, rendered beside this).
    if metadata.pop(STARTUP_SCRIPT_KEY, None) is not None:
        line.words.append(f"--metadata-from-file={STARTUP_SCRIPT_KEY}={STARTUP_SCRIPT_FILE}")
    line.words.append(f"--metadata={_gcloud_dict(metadata)}")
    if vm.get("shieldedInstanceConfig", {}).get("enableSecureBoot"):
        line.words.append("--shielded-secure-boot")
    if vm.get("description"):
        line.words.append(f"--description={vm['description']}")


def _disk_flags(line: _Line, disks: list[dict[str, Any]]) -> None:
    boot, *attached = disks
    initialize = boot["initializeParams"]
    project, _, rest = initialize["sourceImage"].removeprefix("projects/").partition("/")
    if rest.startswith("global/images/family/"):
        line.words += [
            f"--image-family={rest.removeprefix('global/images/family/')}",
            f"--image-project={project}",
        ]
    elif rest.startswith("global/images/"):
        line.words += [
            f"--image={rest.removeprefix('global/images/')}",
            f"--image-project={project}",
        ]
    else:
        line.words.append(f"--image={initialize['sourceImage']}")
    if "diskSizeGb" in initialize:
        line.words.append(f"--boot-disk-size={initialize['diskSizeGb']}GB")
    if "diskEncryptionKey" in boot:
        line.words.append(f"--boot-disk-kms-key={boot['diskEncryptionKey']['kmsKeyName']}")
    if initialize.get("enableConfidentialCompute"):
        line.unsaid("the boot disk's initializeParams.enableConfidentialCompute", "true")
    for disk in attached:
        mode = "ro" if disk.get("mode") == "READ_ONLY" else "rw"
        line.words.append(f"--disk=name={disk['source']},mode={mode},boot=no,auto-delete=no")


def _network_flags(line: _Line, interface: dict[str, Any]) -> None:
    if "network" in interface:
        line.words.append(f"--network={interface['network'].rsplit('/', 1)[-1]}")
    if "subnetwork" in interface:
        line.words.append(f"--subnet={interface['subnetwork']}")
    if not interface.get("accessConfigs"):
        line.words.append("--no-address")


def _scheduling_flags(line: _Line, scheduling: dict[str, Any]) -> None:
    model = scheduling["provisioningModel"]
    line.words += ["--maintenance-policy=TERMINATE", f"--provisioning-model={model}"]
    if model == "FLEX_START":
        line.needs("alpha", "--provisioning-model=FLEX_START")
    if "instanceTerminationAction" in scheduling:
        line.words.append(
            f"--instance-termination-action={scheduling['instanceTerminationAction']}"
        )
    if "maxRunDuration" in scheduling:
        line.words.append(f"--max-run-duration={_seconds(scheduling['maxRunDuration'])}")
    graceful = scheduling.get("gracefulShutdown")
    if graceful is not None:
        line.words += [
            "--graceful-shutdown",
            f"--graceful-shutdown-max-duration={_seconds(graceful['maxDuration'])}",
        ]
        line.needs("beta", "--graceful-shutdown")


def _seconds(duration: dict[str, str]) -> str:
    """A Duration ({"seconds": "300"}) in gcloud's syntax (5m)."""
    return gcloud_duration(timedelta(seconds=int(duration["seconds"])))
