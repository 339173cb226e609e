"""The view of `tpuctl supervise`: the files themselves (to save or pipe), or where they were
written."""

from __future__ import annotations

from tpuctl.cli.format import Style
from tpuctl.render.supervisor import Supervisor


def supervisor_view(result: Supervisor, _style: Style) -> str:
    """One file: its text as is. Several: each under a `# ---- NAME ----` line. Written to a
    directory: their paths. Installed: what steps the run."""
    if result.installed:
        return (
            f"{result.unit}: installed ({result.target}, every {result.every_seconds} s): "
            f"{' '.join(result.command)}\n"
        )
    if all(file.path for file in result.files):
        return "".join(f"{file.path}\n" for file in result.files)
    if len(result.files) == 1:
        return result.files[0].content
    return "".join(f"# ---- {file.name} ----\n{file.content}" for file in result.files)
