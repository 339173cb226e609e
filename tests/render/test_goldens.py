"""Every configs/*.yaml renders to the checked-in request, startup values and gcloud command.

Goldens keep what a spec changes: the request (with the startup script cut out, since it is
mostly the fixed template), the startup script's values block and the gcloud line. One golden
keeps a whole rendered script, so a change to the template's fixed text shows in review too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tpuctl.render.compute import render_compute
from tpuctl.render.compute_gcloud import render_compute_gcloud
from tpuctl.render.gcloud import render_gcloud
from tpuctl.render.request import STARTUP_SCRIPT_KEY, render_request, request_as_dict
from tpuctl.render.startup import render_startup_script, render_values, template
from tpuctl.spec.load import load_spec
from tpuctl.spec.model import Spec

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
GOLDEN = ROOT / "tests/golden"
WHOLE_SCRIPT = GOLDEN / "startup-emulator-demo.sh"
PROJECT, ZONE = "my-project", "us-central2-b"
SCRIPT_PLACEHOLDER = "<the rendered startup script: see startup-values.sh>"


def _request_without_script(spec: object) -> str:
    data = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE))  # type: ignore[arg-type]
    for node_spec in data["queued_resource"]["tpu"]["node_spec"]:
        metadata = node_spec["node"].get("metadata", {})
        if STARTUP_SCRIPT_KEY in metadata:
            metadata[STARTUP_SCRIPT_KEY] = SCRIPT_PLACEHOLDER
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _compute_goldens(spec: Spec) -> dict[str, str]:
    """A `tpu.api: compute` spec's requests (the startup script cut out) and gcloud lines."""
    plan = render_compute(spec, project=PROJECT, zone=ZONE, run_name=spec.name, startup_script=None)
    requests = [request.as_dict() for request in plan.requests]
    for request in requests:
        vm = request["body"].get("properties", request["body"])
        for item in vm.get("metadata", {}).get("items", []):
            if item["key"] == STARTUP_SCRIPT_KEY:
                item["value"] = SCRIPT_PLACEHOLDER
    return {
        "requests.json": json.dumps(requests, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
        "gcloud.sh": render_compute_gcloud(plan),
    }


def _check(path: Path, text: str, update: bool, what: str) -> None:
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden {path}; run pytest --update-goldens"
    assert text == path.read_text(encoding="utf-8"), (
        f"{what} renders differently from {path.relative_to(ROOT)}; "
        "if the change is intended, run pytest --update-goldens and review the diff"
    )


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 7


@pytest.mark.parametrize("config", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_config_matches_goldens(config: Path, update_goldens: bool) -> None:
    loaded = load_spec(config, environ={})
    spec = loaded.spec
    assert loaded.warnings == ()
    if spec.tpu.api == "compute":
        rendered = _compute_goldens(spec)
    else:
        rendered = {
            "request.json": _request_without_script(spec),
            "gcloud.sh": render_gcloud(spec, project=PROJECT, zone=ZONE),
        }
    if spec.job is not None:
        rendered["startup-values.sh"] = render_values(spec)
    folder = GOLDEN / config.stem
    for name, text in rendered.items():
        _check(folder / name, text, update_goldens, config.name)


def test_whole_startup_script_matches_its_golden(update_goldens: bool) -> None:
    spec = load_spec(ROOT / "configs/emulator-demo.yaml", environ={}).spec
    _check(WHOLE_SCRIPT, render_startup_script(spec), update_goldens, "emulator-demo.yaml")


def test_no_orphan_goldens() -> None:
    stems = {path.stem for path in CONFIGS}
    assert {path.name for path in GOLDEN.iterdir() if path.is_dir()} <= stems


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_rendered_startup_scripts_pass_shellcheck(tmp_path: Path) -> None:
    """Every config's values block, between the template's head and tail, in one script: a
    rendered script differs from another only there, and shellcheck takes about a second per
    script. Each block defines `preset_args` again, which makes the earlier definitions
    unreachable (SC2317): that one finding is left out here, and scripts/test checks the
    template itself with none left out."""
    head, tail = template()
    blocks = []
    for config in CONFIGS:
        spec = load_spec(config, environ={}).spec
        if spec.job is not None:
            blocks.append(f"# {config.name}\n" + render_values(spec))
    assert len(blocks) >= 5
    script = tmp_path / "startup.sh"
    script.write_text(head + "".join(blocks) + tail, encoding="utf-8")
    checked = subprocess.run(
        ["shellcheck", "--shell=bash", "--exclude=SC2317", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
