"""Offline spec commands: validate, render, plan, and `spec schema`; no credentials, no network."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from tpuctl.cli.options import (
    DURATION,
    DURATION_OR_ZERO,
    output_option,
    project_zone_options,
    set_option,
    spec_argument,
)
from tpuctl.cli.output import emit

if TYPE_CHECKING:
    from tpuctl.spec.load import LoadedSpec


def _warn(message: str) -> None:
    # Plain click output, not rich: warnings are common on the fast paths (render, validate).
    text = f"warning: {message}"
    colour = sys.stderr.isatty() and "NO_COLOR" not in os.environ
    click.echo(click.style(text, fg="yellow") if colour else text, err=True)


def _load(spec_path: str, overrides: Sequence[str]) -> LoadedSpec:
    """The spec as create would read it now (a queueing deadline already past is an error)."""
    from tpuctl.clock import utc_now
    from tpuctl.spec.load import load_spec

    loaded = load_spec(spec_path, overrides=tuple(overrides), now=utc_now())
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
    from tpuctl.cli.views.spec import validation_view
    from tpuctl.spec.results import Validation

    loaded = _load(spec_path, overrides)
    spec = loaded.spec
    warnings = [str(warning) for warning in loaded.warnings]
    result = Validation(
        True, spec.name, spec_path, spec.tpu.accelerator, spec.tpu.slices, spec.capacity.tier
    )
    result.warnings = warnings
    result.api = spec.tpu.api
    emit(result, validation_view)


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
    from tpuctl.cli.views.spec import rendered_view
    from tpuctl.cloud.resolve import offline_location
    from tpuctl.render.gcloud import render_gcloud
    from tpuctl.render.request import render_request, request_as_dict
    from tpuctl.render.startup import render_startup_script
    from tpuctl.spec.results import Rendered

    spec = _load(spec_path, overrides).spec
    if what == "startup-script":  # the same on every project and zone: nothing to resolve
        script = Rendered("startup-script", startup_script=render_startup_script(spec))
        emit(script, rendered_view, exact=True)
        return
    location, warnings = offline_location(
        project_flag=project, zone_flag=zone, spec_project=spec.project, spec_zone=spec.zone
    )
    for warning in warnings:
        _warn(warning)
    result = Rendered(what, location.project, location.zone)  # type: ignore[arg-type]
    if spec.tpu.api == "compute":
        from tpuctl.render.compute import render_compute
        from tpuctl.render.compute_gcloud import render_compute_gcloud

        plan = render_compute(
            spec,
            project=location.project,
            zone=location.zone,
            run_name=spec.name,
            startup_script=None,
        )
        result.api = "compute"
        if what == "gcloud":
            result.gcloud = render_compute_gcloud(plan)
        else:
            result.requests = [request.as_dict() for request in plan.requests]
    elif what == "gcloud":
        result.gcloud = render_gcloud(spec, project=location.project, zone=location.zone)
    else:
        request = render_request(spec, project=location.project, zone=location.zone)
        result.request = request_as_dict(request)
    emit(result, rendered_view, exact=True)  # to copy or save: never wrapped


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
    type=DURATION,
    default=None,
    help="Seconds a checkpoint save stalls training (δ); 60 when not given.",
)
@click.option(
    "--restart-seconds",
    type=DURATION_OR_ZERO,
    default=600.0,
    show_default=True,
    help="Seconds from a failure to training again (R).",
)
@click.option(
    "--step-seconds",
    type=DURATION,
    default=None,
    help="Seconds one training step takes: intervals and lost work also in steps.",
)
@click.option(
    "--prices",
    "prices_file",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="TPUCTL_PRICES",
    help="A YAML or JSON file of dollars per chip-hour, {generation: {tier: price}}, laid "
    "over tpuctl's table of public list prices (on-demand and reserved, US regions).",
)
@click.option(
    "--online",
    is_flag=True,
    default=False,
    help="Also read the checkpoint bucket's location (Cloud Storage) and warn when it is not "
    "the slices' region (the zone from --zone, the spec, TPUCTL_ZONE or CLOUDSDK_COMPUTE_ZONE).",
)
@project_zone_options
@set_option
@output_option
def plan(
    *,
    project: str | None,
    zone: str | None,
    spec_path: str,
    mtbf: float | None,
    mtbf_per_host: bool,
    save_seconds: float | None,
    restart_seconds: float,
    step_seconds: float | None,
    prices_file: str | None,
    online: bool,
    overrides: tuple[str, ...],
) -> None:
    """Slices, VMs, chips, the parallelism check, DCN batch, and the checkpoint arithmetic:
    Young's and Daly's intervals, and periodic against continuous checkpointing; each
    capacity rung's price per hour, and for flex-start how many runs the job needs."""
    from tpuctl.cli.views.spec import plan_view
    from tpuctl.plan import make_plan
    from tpuctl.plan.prices import load_prices

    spec = _load(spec_path, overrides).spec
    bucket = None
    if online:
        from tpuctl.cloud.resolve import offline_location
        from tpuctl.errors import UsageError
        from tpuctl.storage.placement import bucket_placement
        from tpuctl.worker import checkpoint_root

        location, missing = offline_location(
            project_flag=project, zone_flag=zone, spec_project=spec.project, spec_zone=spec.zone
        )
        root = checkpoint_root(spec)
        if root and root.startswith("gs://"):
            if any("no zone" in warning for warning in missing):
                raise UsageError(
                    "plan --online needs the slices' zone to compare the bucket's region with",
                    hint="give --zone, set zone: in the spec, or TPUCTL_ZONE",
                )
            bucket = bucket_placement(root, location.zone)
    result = make_plan(
        spec,
        mtbf=timedelta(seconds=mtbf) if mtbf is not None else None,
        mtbf_per_host=mtbf_per_host,
        save_seconds=save_seconds,
        restart_seconds=restart_seconds,
        step_seconds=step_seconds,
        bucket=bucket,
        prices=load_prices(prices_file),
    )
    for warning in result.warnings:
        _warn(warning)
    emit(result, plan_view)


@click.group("spec")
def spec_group() -> None:
    """Spec utilities: the JSON Schema of the job spec."""


@spec_group.command("schema")
def schema() -> None:
    """Print the job spec's JSON Schema (always JSON, not an envelope: editors and CI linters
    read it as it is)."""
    from tpuctl.spec.load import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()
