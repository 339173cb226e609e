"""Without asyncssh, `tpuctl emulator start` says how to install it: one line, exit 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_emulator_start_without_asyncssh_names_the_extra(tmp_path: Path) -> None:
    # Hide the installed asyncssh from this one process with a meta-path finder.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'asyncssh' or name.startswith('asyncssh.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Hide())\n",
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "tpuctl", "emulator", "start", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "pip install 'tpuctl[emulator]'" in result.stderr
    assert result.stdout == ""
