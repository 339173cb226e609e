"""Finding runs without their specs: every record directory under a checkpoint location (one
listing of the objects called run.json), or every run tpuctl labelled in a project (its queued
resources name their record directory in their node metadata); and the spec a found run keeps
in its run.json, loaded again.

A run is found by its queued resource only while it has one: between a preemption's delete and
the next create, after a give-up or once done, only a listing of its checkpoint location finds
it. A run without checkpoint.dir keeps its record on the machine that supervised it; a project
listing finds it there when this is that machine.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpuctl.errors import TpuctlError
from tpuctl.jobs.reconcile.store import RUN_FILE, local_run_dir
from tpuctl.worker import RECORD_DIR, RECORD_METADATA_KEY, RUN_LABEL, join_location

if TYPE_CHECKING:
    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.zones import ZoneError
    from tpuctl.jobs.reconcile.store import RunFile
    from tpuctl.spec.load import LoadedSpec


@dataclass(frozen=True)
class FoundRun:
    """One run's record directory, and what its queued resource said when it was found by
    one (`name`, `zone`, `state`; None when found by a listing of storage)."""

    url: str
    name: str | None = None
    zone: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class Skipped:
    """A queued resource of a tpuctl run whose record cannot be reached from here."""

    name: str
    zone: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "zone": self.zone, "reason": self.reason}


@dataclass
class Found:
    """Every run found (one per record directory, in its URL's order), the queued resources
    skipped, and the zones that could not be asked."""

    runs: list[FoundRun] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    zone_errors: list[ZoneError] = field(default_factory=list)

    def add(self, other: Found) -> Found:
        known = {run.url for run in self.runs}
        self.runs += [run for run in other.runs if run.url not in known]
        self.runs.sort(key=lambda run: run.url)
        self.skipped += other.skipped
        self.zone_errors += other.zone_errors
        return self


def is_record_dir(url: str) -> bool:
    """`…/tpuctl/<run>`: where tpuctl keeps a run's record beside its checkpoints."""
    parent = posixpath.dirname(url.rstrip("/"))
    return posixpath.basename(parent) == RECORD_DIR


def runs_under(url: str) -> Found:
    """Every run whose record lives under the checkpoint location `url` (a gs:// prefix or a
    local path): one listing, of the objects called run.json."""
    from tpuctl.storage.locations import open_location

    storage = open_location(url)
    found = Found()
    for path in storage.find(RUN_FILE):
        record = join_location(storage.url, posixpath.dirname(path))
        if is_record_dir(record) and record not in {run.url for run in found.runs}:
            found.runs.append(FoundRun(record))
    return found


def runs_in_project(api: TpuApi, zones: Sequence[str]) -> Found:
    """Every run tpuctl labelled in the project's `zones`, by its queued resources: their
    record location is in their node metadata (one run's queued resources in several zones are
    one run)."""
    from tpuctl.cloud import describe
    from tpuctl.cloud.queries import queued_resources_in_zones

    listed = queued_resources_in_zones(api, zones)
    found = Found(zone_errors=list(listed.errors))
    seen: set[str] = set()
    for zone, queued_resources in listed.answers.items():
        for queued_resource in queued_resources:
            name = describe.short_name(queued_resource.name)
            state = describe.state_name(queued_resource)
            node = _first_node(queued_resource)
            if node is None or RUN_LABEL not in node.labels:
                continue  # a queued resource tpuctl created, but no run's
            url = node.metadata.get(RECORD_METADATA_KEY) or _local_record(
                api.location.project, zone, name
            )
            if url is None:
                found.skipped.append(
                    Skipped(
                        name,
                        zone,
                        "its record is on the machine that supervised it (the spec has no "
                        "checkpoint.dir, or an older tpuctl created it): reconcile it there "
                        "with tpuctl reconcile SPEC",
                    )
                )
                continue
            if url not in seen:
                seen.add(url)
                found.runs.append(FoundRun(url, name, zone, state))
    found.runs.sort(key=lambda run: run.url)
    return found


def load_run_spec(
    run_file: RunFile,
    url: str,
    *,
    environ: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> LoadedSpec:
    """The spec the run found at `url` keeps in its run.json, loaded here: its `${VAR}`s from
    `environ` (this process's), its overrides, its zones as its first step had them. SpecError
    for a variable that is not set; UsageError for a spec with no job, or one that now names
    another record directory (a variable that expands differently here)."""
    from tpuctl.errors import UsageError
    from tpuctl.spec.load import load_spec_text
    from tpuctl.worker import record_dir

    overrides = run_file.overrides
    if len(run_file.zones) > 1:
        overrides = (*overrides, f"capacity.zones=[{', '.join(run_file.zones)}]")
    loaded = load_spec_text(
        run_file.spec, source=run_file.source, overrides=overrides, environ=environ, now=now
    )
    if loaded.spec.job is None:
        raise UsageError(f"the spec in {url}/{RUN_FILE} has no job section")
    record = record_dir(loaded.spec)
    if record is not None and record.rstrip("/") != url.rstrip("/"):
        raise UsageError(
            f"the spec in {url}/{RUN_FILE} now names another record directory, {record}",
            hint="a ${VAR} in checkpoint.dir or job.run_name expands differently here: set it "
            f"as it was ({', '.join(run_file.variables) or 'none are named'})",
        )
    return loaded


def _first_node(queued_resource: Any) -> Any:
    specs = list(queued_resource.tpu.node_spec)
    return specs[0].node if specs else None


def _local_record(project: str, zone: str, name: str) -> str | None:
    """The record a run without checkpoint.dir keeps on this machine, if it is here."""
    from tpuctl.storage.locations import open_location

    url = local_run_dir(project, zone, name)
    try:
        return url if open_location(url).stat(RUN_FILE) is not None else None
    except TpuctlError:
        return None
