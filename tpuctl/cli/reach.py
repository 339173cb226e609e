"""Reaching the workers from a command: the options every fan-out command takes (how to
connect, how hard to try, which workers), and NAME|SPEC turned into workers ready to connect to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.options import (
    DURATION,
    WORKER_SSH_KEYS,
    impersonate_option,
    output_option,
    project_zone_options,
    ssh_settings,
    worker_ssh_options,
)
from tpuctl.cli.targets import Target, connect_target, resolve_target

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.client import TpuApi
    from tpuctl.fanout.operations import Fleet

F = TypeVar("F", bound=Callable[..., Any])


SSH_KEYS = (*WORKER_SSH_KEYS, "connect_timeout", "batch_size", "impersonate", "project", "zone")


def ssh_options(func: F) -> F:
    """Options shared by every fan-out command: reaching the workers, and how hard to try."""
    options = [
        worker_ssh_options,
        click.option(
            "--connect-timeout",
            type=DURATION,
            default=20.0,
            show_default=True,
            help="Deadline for TCP connect + SSH handshake + auth, per attempt.",
        ),
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            default=64,
            show_default=True,
            help="Connections being set up at once (running commands never hold a slot).",
        ),
        click.option(
            "--all-rows",
            "all_rows",
            is_flag=True,
            default=False,
            help="Show every worker's row (above 64 workers the table shows the ones that "
            "were not ok, and one line for the rest).",
        ),
        impersonate_option,
        project_zone_options,
        output_option,
    ]
    for option in options:
        func = option(func)
    return func


def selector_options(default: str = "all") -> Callable[[F], F]:
    def decorate(func: F) -> F:
        func = click.option(
            "--worker",
            default=None,
            help=f"Workers: all, 0, 1,3 or 0-7 (default {default}).",
        )(func)
        return click.option(
            "--node",
            default=None,
            help=f"Slices (nodes) by index, or node ids: all, 0, 1,3 or 0-3 (default {default}).",
        )(func)

    return decorate


@dataclass
class Reached:
    """What a fan-out command acts on: NAME|SPEC resolved, the API, the selected workers."""

    target: Target
    api: TpuApi
    fleet: Fleet


def reach(
    app: AppContext,
    target: str,
    values: dict[str, Any],
    *,
    node: str | None,
    worker: str | None,
    default: str = "all",
    overrides: tuple[str, ...] = (),
) -> Reached:
    """The selected workers of NAME|SPEC, ready to connect to; consumes the SSH options. The
    SSH user defaults to the spec's job.user for `run`-style commands (`--user` wins)."""
    from tpuctl.jobs.fleet import prepare_fleet

    params = {key: values.pop(key) for key in SSH_KEYS}
    app.all_rows = bool(values.pop("all_rows", False))
    resolved = resolve_target(app, target, params.pop("project"), params.pop("zone"), overrides)
    api = connect_target(app, resolved, params.pop("impersonate"))
    settings = ssh_settings(app, **params)
    fleet = prepare_fleet(
        api,
        resolved.name,
        settings,
        nodes=node or default,
        workers=worker or default,
        on_progress=app.info,
        on_warning=app.warn,
    )
    return Reached(resolved, api, fleet)
