"""Offline spec commands: validate, render, plan, and `spec schema`; no credentials, no network."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from tpuctl.cli.options import (
    DURATION,
    app_context,
    output_option,
    project_zone_options,
    set_option,
    spec_argument,
)

if TYPE_CHECKING:
    from rich.console import Console

    from tpuctl.plan import Plan
    from tpuctl.spec.load import LoadedSpec

PLACEHOLDER_PROJECT = "PROJECT_ID"
PLACEHOLDER_ZONE = "ZONE"


def _warn(message: str) -> None:
    # Plain click output, not rich: warnings are common on the fast paths (render, validate).
    text = f"warning: {message}"
    click.echo(text if "NO_COLOR" in os.environ else click.style(text, fg="yellow"), err=True)


def _load(spec_path: str, overrides: Sequence[str]) -> LoadedSpec:
    from tpuctl.spec.load import load_spec

    loaded = load_spec(spec_path, overrides=tuple(overrides))
    for warning in loaded.warnings:
        _warn(str(warning))
    return loaded


@click.command()
@spec_argument
@set_option
@output_option
def validate(spec_path: str, overrides: tuple[str, ...]) -> None:
    """Check a job spec: strict keys, types, topology and parallelism; exit 2 on any mistake.

    Warnings go to stderr; the verdict to stdout.
    """
    loaded = _load(spec_path, overrides)
    spec = loaded.spec
    app = app_context()
    data = {"valid": True, "name": spec.name, "warnings": [str(w) for w in loaded.warnings]}
    if app.machine_output:
        app.emit(data)
        return
    # One plain line; drawing it through rich would double validate's start-up time.
    click.echo(
        f"{spec_path} is valid: {spec.name}, {spec.tpu.slices}× {spec.tpu.accelerator} "
        f"({spec.capacity.tier})"
    )


def offline_project_zone(
    *,
    flag_project: str | None,
    flag_zone: str | None,
    spec_project: str | None,
    spec_zone: str | None,
    environ: Mapping[str, str],
) -> tuple[str, str, list[str]]:
    """Project and zone for an offline render: flags > spec > TPUCTL_* > CLOUDSDK_* > placeholder.

    Returns (project, zone, warnings); never asks gcloud or google.auth, so it needs no network.
    """
    warnings: list[str] = []
    project = (
        flag_project
        or spec_project
        or environ.get("TPUCTL_PROJECT")
        or environ.get("CLOUDSDK_CORE_PROJECT")
    )
    zone = (
        flag_zone or spec_zone or environ.get("TPUCTL_ZONE") or environ.get("CLOUDSDK_COMPUTE_ZONE")
    )
    if not project:
        project = PLACEHOLDER_PROJECT
        warnings.append(
            f"no project given; rendering with the placeholder {PLACEHOLDER_PROJECT} "
            "(set --project, project: in the spec, or TPUCTL_PROJECT)"
        )
    if not zone:
        zone = PLACEHOLDER_ZONE
        warnings.append(
            f"no zone given; rendering with the placeholder {PLACEHOLDER_ZONE} "
            "(set --zone, zone: in the spec, or TPUCTL_ZONE)"
        )
    return project, zone, warnings


@click.command()
@spec_argument
@click.option(
    "--what",
    type=click.Choice(["request", "startup-script", "gcloud"]),
    default="request",
    show_default=True,
    help="The request JSON create would send, the raw startup script, or the gcloud line.",
)
@project_zone_options
@set_option
@output_option
def render(
    *,
    spec_path: str,
    what: str,
    project: str | None,
    zone: str | None,
    overrides: tuple[str, ...],
) -> None:
    """Print what `create` would send, with no credentials and no network."""
    from tpuctl.render.gcloud import render_gcloud
    from tpuctl.render.request import render_request, request_as_dict, request_as_json
    from tpuctl.render.startup import render_startup_script

    spec = _load(spec_path, overrides).spec
    app = app_context()
    if what == "startup-script":  # the same on every project and zone: nothing to resolve
        script = render_startup_script(spec)
        if app.machine_output:
            app.emit({"startup_script": script})
        else:
            _write(script, newline=False)
        return
    project, zone, warnings = offline_project_zone(
        flag_project=project,
        flag_zone=zone,
        spec_project=spec.project,
        spec_zone=spec.zone,
        environ=os.environ,
    )
    for warning in warnings:
        _warn(warning)
    if what == "gcloud":
        line = render_gcloud(spec, project=project, zone=zone)
        if app.machine_output:
            app.emit({"gcloud": line})
        else:
            _write(line)
        return
    request = render_request(spec, project=project, zone=zone)
    if app.output == "yaml":
        app.emit(request_as_dict(request))
    else:
        _write(request_as_json(request))


def _write(text: str, *, newline: bool = True) -> None:
    sys.stdout.write(text if not newline or text.endswith("\n") else text + "\n")
    sys.stdout.flush()


@click.command()
@spec_argument
@click.option(
    "--mtbf",
    type=DURATION,
    default=None,
    help="Mean time between failures of the whole job (e.g. 24h), or of one host with "
    "--mtbf-per-host. Enables the checkpoint-interval arithmetic.",
)
@click.option(
    "--mtbf-per-host",
    is_flag=True,
    default=False,
    help="--mtbf is per host: the job's MTBF is that divided by the number of hosts.",
)
@click.option(
    "--save-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds a checkpoint save stalls training (δ); 60 when not given.",
)
@click.option(
    "--restart-seconds",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Seconds from a failure to training again (R).",
)
@set_option
@output_option
def plan(
    *,
    spec_path: str,
    mtbf: float | None,
    mtbf_per_host: bool,
    save_seconds: float | None,
    restart_seconds: float,
    overrides: tuple[str, ...],
) -> None:
    """Slices, VMs, chips, the parallelism check, DCN batch and checkpoint-interval arithmetic."""
    from tpuctl.errors import SpecError
    from tpuctl.plan import make_plan
    from tpuctl.topology import AcceleratorError

    spec = _load(spec_path, overrides).spec
    try:
        result = make_plan(
            spec,
            mtbf=timedelta(seconds=mtbf) if mtbf is not None else None,
            mtbf_per_host=mtbf_per_host,
            save_seconds=save_seconds,
            restart_seconds=restart_seconds,
        )
    except AcceleratorError as error:
        raise SpecError(str(error), path="tpu.accelerator") from error
    app_context().emit(result, lambda console: draw_plan(result, console))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours}h {minutes:02d}m"


def draw_plan(result: Plan, console: Console) -> None:
    """The plan for people: sizes per slice and in total, then each check in plain words."""
    from rich.table import Table

    console.print(
        f"{result.name}: {result.slices}× {result.accelerator} "
        f"({result.generation}, topology {result.topology})"
    )
    sizes = Table(show_edge=False, pad_edge=False)
    sizes.add_column("")
    sizes.add_column("per slice", justify="right")
    sizes.add_column("total", justify="right")
    sizes.add_row("VMs (hosts)", str(result.vms_per_slice), str(result.vms_total))
    sizes.add_row("chips", str(result.chips_per_slice), str(result.chips_total))
    sizes.add_row("TensorCores", str(result.tensorcores_per_slice), str(result.tensorcores_total))
    sizes.add_row("chips per VM", str(result.chips_per_vm), "")
    console.print(sizes)
    lines: list[str] = []
    if result.parallelism is not None:
        mesh = result.parallelism
        lines += ["", "Parallelism:", f"  {mesh.ici.message}", f"  {mesh.dcn.message}"]
        lines += [f"  warning: {warning}" for warning in mesh.warnings]
    if result.dcn is not None:
        lines += ["", "DCN (data parallelism across slices):"]
        lines += [f"  {note}" for note in result.dcn.notes]
    if result.checkpoint is not None:
        check = result.checkpoint
        lines += [
            "",
            f"Checkpoint interval (M = {_duration(check.mtbf_seconds)} [{check.mtbf_basis}], "
            f"δ = {_duration(check.save_seconds)}, R = {_duration(check.restart_seconds)}):",
            f"  Young √(2δM):          {_duration(check.young_interval_seconds)}",
            f"  Daly:                  {_duration(check.daly_interval_seconds)}",
            f"  waste at Daly's τ:     {check.waste_fraction:.1%}",
            f"  lost work per failure: {_duration(check.lost_work_per_failure_seconds)}",
        ]
        lines += [f"  {note}" for note in check.notes]
    if result.notes:
        lines += ["", *(f"note: {note}" for note in result.notes)]
    for line in lines:
        console.print(line, markup=False, highlight=False)


@click.group("spec")
def spec_group() -> None:
    """Spec utilities: the JSON Schema of the job spec."""


@spec_group.command("schema")
def schema() -> None:
    """Print the job spec's JSON Schema (always JSON), for editors and CI linters."""
    from tpuctl.spec.load import json_schema

    _write(json.dumps(json_schema(), indent=2, ensure_ascii=False))
