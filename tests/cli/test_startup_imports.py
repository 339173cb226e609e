"""`tpuctl --help` and the offline commands stay light: no grpc, google, paramiko or rich; and
every command starts with the garbage collector set for its imports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HEAVY = ("grpc", "google", "paramiko", "rich")

# Runs tpuctl in a fresh interpreter, then reports which top-level packages it had imported.
PROBE = """
import json, sys
from tpuctl.cli.main import run
code = run(sys.argv[1:])
sys.stdout.flush()
loaded = sorted({name.split(".")[0] for name in sys.modules})
sys.stderr.write("\\nIMPORTED " + json.dumps({"code": code, "modules": loaded}) + "\\n")
"""


def imported_by(args: list[str], cwd: Path) -> tuple[int, set[str]]:
    repo = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    environ["PYTHONPATH"] = str(repo)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = done.stderr.rsplit("IMPORTED ", 1)[-1]
    data = json.loads(report)
    return int(data["code"]), set(data["modules"])


@pytest.mark.parametrize(
    "args",
    [["--help"], ["validate", "--help"], ["render", "--help"], ["plan", "--help"], ["--version"]],
    ids=["root", "validate", "render", "plan", "version"],
)
def test_help_imports_no_heavy_module(tmp_path: Path, args: list[str]) -> None:
    code, modules = imported_by(args, tmp_path)
    assert code == 0
    assert modules.isdisjoint(HEAVY), sorted(modules & set(HEAVY))


def test_validate_imports_no_heavy_module(tmp_path: Path, write_spec: Callable[..., Path]) -> None:
    code, modules = imported_by(["validate", str(write_spec())], tmp_path)
    assert code == 0
    assert "yaml" in modules  # it did load the spec
    assert modules.isdisjoint(HEAVY), sorted(modules & set(HEAVY))


def test_render_needs_no_credentials(tmp_path: Path, write_spec: Callable[..., Path]) -> None:
    """With credentials that cannot load and no gcloud config, render still works offline."""
    repo = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TPUCTL_", "CLOUDSDK_"))}
    environ.update(
        PYTHONPATH=str(repo),
        GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "no-such-key.json"),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
        NO_GCE_CHECK="True",
    )
    for what in ("request", "startup-script", "gcloud"):
        done = subprocess.run(
            [sys.executable, "-m", "tpuctl", "render", str(write_spec()), "--what", what],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout
        if what != "startup-script":  # the placeholder, not a project found by google.auth
            assert "PROJECT_ID" in done.stderr


@pytest.mark.parametrize(
    "command", [["-m", "tpuctl"], ["-c", "import sys; from tpuctl.cli.main import main; main()"]]
)
def test_both_entry_points_collect_garbage_less_often_from_the_start(
    tmp_path: Path, command: list[str]
) -> None:
    """`python -m tpuctl` and the console script (tpuctl.cli.main:main) raise the youngest
    generation's threshold before the command's imports (tpuctl.cli.main.fewer_collections),
    and freeze what the command made before it exits (no_last_collection); a sitecustomize
    module prints the threshold and the frozen count the process ends with."""
    probe = tmp_path / "sitecustomize.py"
    probe.write_text(
        "import atexit, gc, sys\n"
        "atexit.register(lambda: sys.stderr.write(\n"
        "    f'THRESHOLD {gc.get_threshold()[0]} FROZEN {gc.get_freeze_count()}\\n'))\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2])])
    done = subprocess.run(
        [sys.executable, *command, "--version"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    threshold, frozen = re.findall(r"THRESHOLD (\d+) FROZEN (\d+)", done.stderr)[0]
    assert threshold == "10000" and int(frozen) > 10_000  # the imports' objects, at least
