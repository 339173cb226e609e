"""Every table command at 80 columns, in a pipe and at 200 columns: one line per row always,
shortened in the middle only on a narrow terminal, identifying columns whole, whole values
in a pipe (so grep and awk see whole rows)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import Project, unique
from tests.support import Outcome, wait_for
from tpuctl.cli.views.table import ELLIPSIS, display_width

pytestmark = pytest.mark.emulator

LONG = "this trainer prints a rather long last line that no eighty-column table can hold whole"
WIDTHS: dict[str, int | None] = {"80": 80, "pipe": None, "200": 200}


@pytest.fixture(scope="module")
def world(emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 2-slice QR running a job that prints LONG, a detached run, a checkpoint dir with a
    journal, a file on every worker: what every table command reads."""
    from tests.harness import project_in
    from tpuctl.spec.load import load_spec
    from tpuctl.storage.journal import Journal

    root = tmp_path_factory.mktemp("tables")
    with project_in(emulator, root) as project:
        name = unique("tables-with-a-long-name")
        checkpoints = root / "ckpt"
        spec = project.write_spec(
            {
                "name": name,
                "tpu": {"accelerator": "v4-16", "runtime": "tpu-ubuntu2204-base", "slices": 2},
                "checkpoint": {"dir": str(checkpoints)},
                "job": {"command": f"echo '{LONG}'; sleep 600"},
            }
        )
        qr = project.create_from_spec(spec)
        for step in (100, 200):
            (checkpoints / str(step)).mkdir(parents=True)
            (checkpoints / str(step) / "commit_success.txt").write_text("ok")
        journal = Journal(load_spec(spec, environ=project.env).spec)
        for kind in ("up.start", "job.started", "job.running"):
            journal.append(kind, message=f"{name}: {kind} {LONG}")
        for s in range(2):
            for w in range(2):
                home = qr.home(s, w)
                home.mkdir(parents=True, exist_ok=True)
                (home / "result.txt").write_text(f"{s}/{w}\n")

        def running() -> bool:
            listed = project.cli("ps", str(spec), "--job", "--format", "json")
            return listed.exit_code == 0 and all(
                row["detail"]["state"] == "running" and row["detail"]["last_line"] == LONG
                for row in listed.json()["workers"]
            )

        wait_for(running, 60, "the job on every worker")
        detached = project.cli("ssh", name, "--detach", "--", f"echo '{LONG}'; sleep 600")
        assert detached.exit_code == 0, detached.stderr
        yield {"project": project, "spec": spec, "name": name, "root": root, "qr": qr}
        project.cli("stop", name, "--grace", "1")


def _commands(world: dict[str, Any]) -> dict[str, list[str]]:
    name, spec, root = world["name"], str(world["spec"]), world["root"]
    return {
        "status": ["status", name],
        "status --jobs": ["status", spec, "--jobs"],
        "list": ["list"],
        "ps": ["ps", name],
        "ps --job": ["ps", spec, "--job"],
        "ssh": ["ssh", name, "--", f"echo '{LONG}'"],
        "upload": ["upload", name, str(root / "ckpt"), "~/uploaded-checkpoints"],
        "download --all": ["download", name, "result.txt", str(root / "got"), "--all"],
        "checkpoints": ["checkpoints", str(root / "ckpt")],
        "report": ["report", spec],
        "plan": ["plan", spec, "--mtbf", "24h", "--step-seconds", "2"],
        "wait": ["wait", name],
        "emulator status": ["emulator", "status"],
    }


STREAMED = re.compile(r"\[\d+/\d+\] ")


def _ours(lines: list[str]) -> list[str]:
    """tpuctl's own lines: not the workers' output streamed as `[slice/worker] line`."""
    return [line for line in lines if not STREAMED.match(line)]


def _rows(lines: list[str]) -> list[str]:
    """Table rows (and headers): columns apart by two spaces inside the line."""
    return [line for line in lines if "  " in line.strip()]


def _run(project: Project, args: list[str], width: int | None, monkeypatch: Any) -> Outcome:
    monkeypatch.setattr("tpuctl.cli.context.terminal_width", lambda: width)
    return project.cli(*args)


# Every table command; the last two are left out at narrow widths, where what they show (a
# wait's status, the emulator's every queued resource) adds nothing the others do not test.
TABLE_COMMANDS = [
    "status",
    "status --jobs",
    "list",
    "ps",
    "ps --job",
    "ssh",
    "upload",
    "download --all",
    "checkpoints",
    "report",
    "plan",
    "wait",
    "emulator status",
]


@pytest.mark.parametrize("command", TABLE_COMMANDS)
def test_one_line_per_row_at_any_width(
    world: dict[str, Any], command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _commands(world)[command]
    outputs = {}
    for mode, width in WIDTHS.items():
        outcome = _run(world["project"], args, width, monkeypatch)
        assert outcome.exit_code == 0, f"{command} ({mode}): {outcome.stderr}"
        # ssh's stdout is the workers' output alone; its table is on stderr.
        outputs[mode] = (outcome.stderr if command == "ssh" else outcome.stdout).splitlines()
    narrow, pipe, wide = (_ours(outputs[mode]) for mode in ("80", "pipe", "200"))
    too_long = [line for line in narrow if display_width(line) > 80]
    assert not too_long, f"{command} at 80 columns:\n" + "\n".join(too_long)
    # A wrapped row would add lines: every mode has the same rows (prose may wrap). The
    # emulator's status lists every test's queued resources, which come and go meanwhile.
    if command != "emulator status":
        assert len(_rows(narrow)) == len(_rows(pipe)) == len(_rows(wide)), (command, narrow, pipe)
    assert len(_rows(pipe)) >= 2, (command, pipe)  # a header and a row at least
    assert not any(ELLIPSIS in line for line in pipe), f"{command} in a pipe shortened a value"
    assert not any(ELLIPSIS in line for line in wide), f"{command} at 200 columns"
    if command in ("status", "list", "wait"):  # the name is an identifying column: whole
        assert any(world["name"] in line for line in narrow)


@pytest.mark.parametrize("width", [40, 50, 60, 70])
@pytest.mark.parametrize("command", TABLE_COMMANDS[:-2])
def test_narrow_terminals_keep_states_whole_and_one_ellipsis_a_cell(
    world: dict[str, Any], command: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = _run(world["project"], _commands(world)[command], width, monkeypatch)
    assert outcome.exit_code == 0, outcome.stderr
    lines = _ours((outcome.stderr if command == "ssh" else outcome.stdout).splitlines())
    assert all(display_width(line) <= width for line in lines), lines
    for line in _rows(lines):
        assert all(cell.count(ELLIPSIS) <= 1 for cell in line.split("  ")), line
    rows = [line.split() for line in lines if re.match(r"\d+/\d+ ", line)]
    if command in ("ps --job", "status --jobs", "ps"):
        assert len(rows) == 4 and all(row[1] == "running" for row in rows), lines
    elif command in ("ssh", "upload", "download --all"):
        assert len(rows) == 4 and all(row[1] == "ok" for row in rows), lines
    elif command == "list":
        assert any(line.split()[:2] == [world["name"], "ACTIVE"] for line in lines), lines
    elif command == "status":
        assert lines[0].startswith(f"{world['name']}: ACTIVE"), lines  # the name: whole


def test_a_pipe_keeps_whole_rows_for_grep(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = _run(world["project"], ["ps", str(world["spec"]), "--job"], None, monkeypatch)
    running = [line for line in outcome.stdout.splitlines() if " running " in line]
    assert len(running) == 4 and all(line.endswith(LONG) for line in running)
    assert all(line.split()[0] in ("0/0", "0/1", "1/0", "1/1") for line in running)
    narrow = _run(world["project"], ["ps", str(world["spec"]), "--job"], 80, monkeypatch)
    assert sum(ELLIPSIS in line for line in narrow.stdout.splitlines()) == 4  # LONG, shortened


def test_wide_shows_the_columns_a_terminal_hides(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _run(world["project"], ["ps", world["name"]], None, monkeypatch).stdout
    wide = _run(world["project"], ["ps", world["name"], "--format", "wide"], None, monkeypatch)
    assert "NODE" not in plain.splitlines()[0] and "NODE" in wide.stdout.splitlines()[0]
    assert "ADDRESS" in wide.stdout.splitlines()[0]
    assert world["qr"].node_ids[1] in wide.stdout  # node ids shown whole
