"""Every configs/*.yaml renders to the checked-in request, startup script and gcloud command."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.render.gcloud import render_gcloud
from tpuctl.render.request import render_request, request_as_json
from tpuctl.render.startup import render_startup_script
from tpuctl.spec.load import load_spec

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
GOLDEN = ROOT / "tests/golden"
PROJECT, ZONE = "my-project", "us-central2-b"


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 7


@pytest.mark.parametrize("config", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_config_matches_goldens(config: Path, update_goldens: bool) -> None:
    loaded = load_spec(config, environ={})
    spec = loaded.spec
    assert loaded.warnings == ()
    rendered = {
        "request.json": request_as_json(render_request(spec, project=PROJECT, zone=ZONE)),
        "gcloud.sh": render_gcloud(spec, project=PROJECT, zone=ZONE),
    }
    if spec.job is not None:
        rendered["startup.sh"] = render_startup_script(spec)
    folder = GOLDEN / config.stem
    if update_goldens:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            (folder / name).write_text(text, encoding="utf-8")
    for name, text in rendered.items():
        path = folder / name
        assert path.exists(), f"missing golden {path}; run pytest --update-goldens"
        assert text == path.read_text(encoding="utf-8"), (
            f"{config.name} renders differently from {path.relative_to(ROOT)}; "
            "if the change is intended, run pytest --update-goldens and review the diff"
        )


def test_no_orphan_goldens() -> None:
    stems = {path.stem for path in CONFIGS}
    assert {path.name for path in GOLDEN.iterdir() if path.is_dir()} <= stems
