"""The package builds without a warning (an SPDX license string, the license file shipped),
from this checkout, with no network (the test extra brings setuptools)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_builds_without_warnings(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(tmp_path), "-v"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    output = built.stdout + built.stderr
    warnings = [line for line in output.splitlines() if "Warning" in line or "deprecated" in line]
    assert not warnings, "\n".join(warnings)
    [wheel] = tmp_path.glob("tpuctl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(name.endswith("licenses/LICENSE") for name in names)
    assert "tpuctl/render/startup.sh" in names  # the startup script ships as package data
