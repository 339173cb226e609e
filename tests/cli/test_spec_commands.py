"""validate, render, plan and `spec schema` in-process: exit code, stdout and stderr apart."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuctl.cloud.resolve import offline_location

Cli = Callable[..., Any]
WriteSpec = Callable[..., Path]

HEAD = "apiVersion: tpuctl/v1\nname: demo\ntpu:\n"
GOOD_TPU = "  accelerator: v4-16\n  runtime: tpu-ubuntu2204-base\n"

# One spec per class of mistake: (id, text, the dotted path named, or None when the file has none).
BAD_SPECS = [
    ("yaml-syntax", HEAD + "  accelerator: v4-16\n  runtime: [unclosed\n", None),
    ("unknown-key", HEAD + GOOD_TPU + "capacity:\n  spto: true\n", "capacity.spto"),
    ("wrong-type", HEAD + GOOD_TPU + "  slices: four\n", "tpu.slices"),
    ("missing-key", HEAD + "  accelerator: v4-16\n", "tpu.runtime"),
    ("bad-accelerator", HEAD + "  accelerator: v4-12\n  runtime: x\n", "tpu.accelerator"),
    ("out-of-range", HEAD + GOOD_TPU + "  slices: 257\n", "tpu.slices"),
    ("multislice-v3", HEAD + "  accelerator: v3-8\n  runtime: r\n  slices: 2\n", "tpu.slices"),
    (
        "mesh-mismatch",
        HEAD + GOOD_TPU + "job:\n  command: x\n  parallelism:\n    ici: {fsdp: 4}\n",
        "job.parallelism.ici",
    ),
    ("bad-api-version", HEAD.replace("v1", "v9") + GOOD_TPU, "apiVersion"),
    ("not-a-mapping", "- a\n- b\n", None),
]


@pytest.mark.parametrize(
    ("text", "path"), [case[1:] for case in BAD_SPECS], ids=[c[0] for c in BAD_SPECS]
)
def test_bad_spec_is_exit_2_with_one_located_line(
    cli: Cli, write_spec: WriteSpec, text: str, path: str | None
) -> None:
    spec = write_spec(text)
    outcome = cli(["validate", str(spec)])
    assert outcome.exit_code == 2
    assert outcome.stdout == ""
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1, outcome.stderr
    located = re.escape(str(spec)) + r":\d+:\d+: "
    if path is not None:
        located += re.escape(path) + ": "
    assert re.match(f"^error: {located}", lines[0]), lines[0]
    assert "Traceback" not in outcome.stderr


@pytest.mark.parametrize(
    ("text", "path"), [case[1:] for case in BAD_SPECS], ids=[c[0] for c in BAD_SPECS]
)
def test_bad_spec_json_error_object(
    cli: Cli, write_spec: WriteSpec, text: str, path: str | None
) -> None:
    spec = write_spec(text)
    outcome = cli(["--format", "json", "validate", str(spec)])
    assert outcome.exit_code == 2
    error = json.loads(outcome.stdout)["error"]
    assert error["kind"] == "spec"
    assert error["exit_code"] == 2
    assert error["file"] == str(spec)
    assert isinstance(error["line"], int) and error["line"] >= 1
    assert error.get("path") == path
    assert error["message"]


@pytest.mark.parametrize(
    ("text", "path"), [case[1:] for case in BAD_SPECS], ids=[c[0] for c in BAD_SPECS]
)
@pytest.mark.parametrize("command", ["render", "plan"])
def test_render_and_plan_refuse_bad_specs_too(
    cli: Cli, write_spec: WriteSpec, command: str, text: str, path: str | None
) -> None:
    outcome = cli([command, str(write_spec(text))])
    assert outcome.exit_code == 2
    assert outcome.stdout == ""
    assert outcome.stderr.startswith("error: ")


def test_validate_names_every_mistake_with_its_place_and_fix(
    cli: Cli, write_spec: WriteSpec
) -> None:
    from tests.spec.test_errors import MANY, MANY_PATHS

    spec = write_spec(MANY)
    outcome = cli(["validate", str(spec)])
    assert outcome.exit_code == 2
    head, *lines = outcome.stderr.splitlines()
    assert head == f"error: {spec}: {len(MANY_PATHS)} mistakes"
    assert len(lines) == len(MANY_PATHS)
    for line, path in zip(lines, MANY_PATHS, strict=True):
        assert re.match(
            rf"^  {re.escape(str(spec))}:\d+:\d+: {re.escape(path)}: .+ \(.+\)$", line
        ), line
    as_json = cli(["--format", "json", "validate", str(spec)])
    assert as_json.exit_code == 2
    error = json.loads(as_json.stdout)["error"]
    assert [item["path"] for item in error["errors"]] == MANY_PATHS
    assert all(item["hint"] for item in error["errors"])  # each with its fix


def test_misspelled_tier_key_names_the_fix(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(["validate", str(write_spec(HEAD + GOOD_TPU + "capacity:\n  spto: true\n"))])
    assert outcome.exit_code == 2
    assert "capacity.spto: unknown key" in outcome.stderr
    assert "did you mean 'spot'" in outcome.stderr


@pytest.mark.parametrize(
    ("spec_text", "message"),
    [("", "the spec is empty"), (None, "cannot read spec file")],
    ids=["empty-file", "missing-file"],
)
def test_unreadable_or_empty_spec(
    cli: Cli, write_spec: WriteSpec, tmp_path: Path, spec_text: str | None, message: str
) -> None:
    spec = write_spec(spec_text) if spec_text is not None else tmp_path / "absent.yaml"
    outcome = cli(["validate", str(spec)])
    assert outcome.exit_code == 2
    assert outcome.stdout == ""
    assert outcome.stderr.startswith(f"error: {spec}: {message}")
    as_json = cli(["validate", str(spec), "--format", "json"])
    error = json.loads(as_json.stdout)["error"]
    assert (error["kind"], error["exit_code"], error["file"]) == ("spec", 2, str(spec))


def test_validate_valid(cli: Cli, write_spec: WriteSpec) -> None:
    spec = write_spec()
    outcome = cli(["validate", str(spec)])
    assert outcome.exit_code == 0
    assert outcome.stdout == f"{spec} is valid: demo, 2× v4-16 (spot)\n"
    assert outcome.stderr == ""


def test_validate_json(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(["validate", str(write_spec()), "--format", "json"])
    assert outcome.exit_code == 0
    assert json.loads(outcome.stdout) == {
        "apiVersion": "tpuctl/v1",
        "kind": "Validation",
        "valid": True,
        "name": "demo",
        "source": str(write_spec()),
        "accelerator": "v4-16",
        "slices": 2,
        "tier": "spot",
        "warnings": [],
        "api": "tpu",
    }


def test_validate_yaml(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(["--format", "yaml", "validate", str(write_spec())])
    document = yaml.safe_load(outcome.stdout)
    assert (document["kind"], document["valid"], document["name"]) == ("Validation", True, "demo")


def test_validate_warnings_go_to_stderr(cli: Cli, write_spec: WriteSpec) -> None:
    # A runtime meant for another generation is a warning, not an error.
    text = HEAD + "  accelerator: v5litepod-16\n  runtime: v2-alpha-tpuv6e\n"
    outcome = cli(["validate", str(write_spec(text))])
    assert outcome.exit_code == 0
    assert outcome.stdout.startswith(f"{write_spec(text)} is valid")
    assert outcome.stderr.startswith("warning: ")
    assert "v2-alpha-tpuv6e" in outcome.stderr
    as_json = cli(["validate", str(write_spec(text)), "--format", "json"])
    data = json.loads(as_json.stdout)
    assert data["valid"] is True and len(data["warnings"]) == 1
    assert as_json.stderr.startswith("warning: ")


def test_validate_set_override(cli: Cli, write_spec: WriteSpec) -> None:
    spec = str(write_spec())
    outcome = cli(
        ["validate", spec, "--set", "tpu.slices=4", "--set", "job.parallelism.dcn.data=4"]
    )
    assert outcome.exit_code == 0, outcome.stderr
    assert "4× v4-16" in outcome.stdout
    bad = cli(["validate", spec, "--set", "tpu.slices=300"])
    assert bad.exit_code == 2
    assert bad.stderr.startswith("error: --set tpu.slices=300: tpu.slices: ")


def test_render_request_default(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(
        ["render", str(write_spec()), "--project", "project-1", "--zone", "us-central2-b"]
    )
    assert outcome.exit_code == 0, outcome.stderr
    request = json.loads(outcome.stdout)
    assert request["parent"] == "projects/project-1/locations/us-central2-b"
    assert request["queued_resource_id"] == "demo"
    assert "spot" in request["queued_resource"]
    node_spec = request["queued_resource"]["tpu"]["node_spec"][0]
    assert node_spec["node"]["accelerator_type"] == "v4-16"
    assert node_spec["multi_node_params"]["node_count"] == 2
    assert "startup-script" in node_spec["node"]["metadata"]
    assert outcome.stderr == ""
    # --format json prints the same request.
    as_json = cli(
        [
            "render",
            str(write_spec()),
            "--project",
            "project-1",
            "--zone",
            "us-central2-b",
            "--format",
            "json",
        ]
    )
    document = json.loads(as_json.stdout)
    assert (document["apiVersion"], document["kind"], document["what"]) == (
        "tpuctl/v1",
        "Render",
        "request",
    )
    assert document["request"] == request


def test_render_request_yaml(cli: Cli, write_spec: WriteSpec) -> None:
    args = [
        "render",
        str(write_spec()),
        "--project",
        "my-project",
        "--zone",
        "us-central2-b",
        "--format",
        "yaml",
    ]
    assert (
        yaml.safe_load(cli(args).stdout)["request"]["parent"]
        == "projects/my-project/locations/us-central2-b"
    )


def test_render_startup_script_raw_and_json(cli: Cli, write_spec: WriteSpec) -> None:
    spec = str(write_spec())
    raw = cli(["render", spec, "--what", "startup-script"])
    assert raw.exit_code == 0
    assert raw.stdout.startswith("#!")
    assert "python3 train.py" in raw.stdout
    assert raw.stderr == ""  # no project or zone is needed, so no placeholder warning
    wrapped = cli(["render", spec, "--what", "startup-script", "--format", "json"])
    assert json.loads(wrapped.stdout)["startup_script"] == raw.stdout


def test_render_gcloud_raw_and_json(cli: Cli, write_spec: WriteSpec) -> None:
    spec = str(write_spec())
    raw = cli(
        ["render", spec, "--what", "gcloud", "--project", "my-project", "--zone", "us-central2-b"]
    )
    assert raw.exit_code == 0
    assert raw.stdout.startswith("gcloud ")
    assert "--project=my-project" in raw.stdout and "--zone=us-central2-b" in raw.stdout
    wrapped = cli(
        [
            "render",
            spec,
            "--what",
            "gcloud",
            "--format",
            "json",
            "--project",
            "my-project",
            "--zone",
            "us-central2-b",
        ]
    )
    assert json.loads(wrapped.stdout)["gcloud"].rstrip("\n") == raw.stdout.rstrip("\n")


def test_render_unknown_what_is_usage_error(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(["render", str(write_spec()), "--what", "terraform"])
    assert outcome.exit_code == 2
    assert outcome.stdout == ""
    assert outcome.stderr.startswith("error: Invalid value for '--what'")


def _parent(outcome: Any) -> str:
    return str(json.loads(outcome.stdout)["parent"])


def test_render_placeholders_warn(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(["render", str(write_spec())])
    assert outcome.exit_code == 0
    assert _parent(outcome) == "projects/PROJECT_ID/locations/ZONE"
    warnings = outcome.stderr.splitlines()
    assert len(warnings) == 2
    assert all(line.startswith("warning: ") for line in warnings)
    assert "PROJECT_ID" in warnings[0] and "ZONE" in warnings[1]


def test_render_project_zone_precedence(cli: Cli, write_spec: WriteSpec) -> None:
    plain = str(write_spec())
    with_spec = str(
        write_spec(
            plain_text_with("project: spec-project\nzone: us-south1-a\n"), name="located.yaml"
        )
    )
    cloudsdk = {"CLOUDSDK_CORE_PROJECT": "sdk-project", "CLOUDSDK_COMPUTE_ZONE": "europe-west4-a"}
    tpuctl = {"TPUCTL_PROJECT": "tpuctl-project", "TPUCTL_ZONE": "us-west4-a"}
    both = {**cloudsdk, **tpuctl}
    assert (
        _parent(cli(["render", plain], env=cloudsdk))
        == "projects/sdk-project/locations/europe-west4-a"
    )
    assert (
        _parent(cli(["render", plain], env=both)) == "projects/tpuctl-project/locations/us-west4-a"
    )
    assert (
        _parent(cli(["render", with_spec], env=both))
        == "projects/spec-project/locations/us-south1-a"
    )
    flags = ["--project", "flag-project", "--zone", "us-east1-d"]
    assert (
        _parent(cli(["render", with_spec, *flags], env=both))
        == "projects/flag-project/locations/us-east1-d"
    )
    quiet = cli(["render", plain], env=both)
    assert quiet.stderr == ""


def plain_text_with(extra: str) -> str:
    from_head = "apiVersion: tpuctl/v1\nname: demo\n"
    return from_head + extra + "tpu:\n" + GOOD_TPU


def test_offline_project_zone_pure() -> None:
    location, warnings = offline_location(
        project_flag=None,
        zone_flag="us-east1-d",
        spec_project=None,
        spec_zone="us-south1-a",
        environ={},
    )
    assert (location.project, location.zone) == ("PROJECT_ID", "us-east1-d")
    assert len(warnings) == 1 and "PROJECT_ID" in warnings[0]


def test_plan_table(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(["plan", str(write_spec()), "--mtbf", "24h"])
    assert outcome.exit_code == 0, outcome.stderr
    out = outcome.stdout
    assert "demo: 2× v4-16" in out
    assert re.search(r"VMs \(hosts\)\s+2\s+4\n", out), out
    assert re.search(r"chips\s+8\s+16\n", out), out
    assert "ici: fsdp 8 = 8, chips per slice = 8: ok" in out
    assert "176,000 tokens" in out
    assert "Daly:" in out
    assert outcome.stderr == ""


def test_plan_json(cli: Cli, write_spec: WriteSpec) -> None:
    args = ["plan", str(write_spec()), "--format", "json", "--mtbf", "24h", "--mtbf-per-host"]
    outcome = cli([*args, "--save-seconds", "300", "--restart-seconds", "600"])
    assert outcome.exit_code == 0, outcome.stderr
    data = json.loads(outcome.stdout)
    assert (data["slices"], data["vms_total"], data["chips_total"]) == (2, 4, 16)
    assert data["tensorcores_total"] == 32
    assert data["parallelism"]["ok"] is True
    assert data["dcn"]["min_global_batch_tokens"] == 176_000
    checkpoint = data["checkpoint"]
    assert checkpoint["mtbf_seconds"] == 6 * 3600  # 24 h per host, 4 hosts
    assert checkpoint["save_seconds"] == 300
    assert 56 * 60 < checkpoint["daly_interval_seconds"] < 58 * 60  # Daly's 6 h case


def test_plan_yaml(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(["plan", str(write_spec()), "--format", "yaml"])
    data = yaml.safe_load(outcome.stdout)
    assert data["checkpoint"] is None
    assert any("--mtbf" in note for note in data["notes"])


def test_plan_without_parallelism_says_so(cli: Cli, write_spec: WriteSpec) -> None:
    outcome = cli(["plan", str(write_spec(HEAD + GOOD_TPU))])
    assert outcome.exit_code == 0
    assert "no job" in outcome.stdout


@pytest.mark.parametrize("mtbf", ["0", "soon", "-5m"])
def test_plan_bad_mtbf_is_usage_error(cli: Cli, write_spec: WriteSpec, mtbf: str) -> None:
    outcome = cli(["plan", str(write_spec()), "--mtbf", mtbf])
    assert outcome.exit_code == 2
    assert outcome.stdout == ""
    assert outcome.stderr.startswith("error: Invalid value for '--mtbf'")


def test_spec_schema_is_json(cli: Cli) -> None:
    outcome = cli(["spec", "schema"])
    assert outcome.exit_code == 0
    schema = json.loads(outcome.stdout)
    assert "tpu" in schema["properties"]
    assert schema.get("additionalProperties") is False
    # Always JSON, even when yaml output is asked for.
    assert json.loads(cli(["--format", "yaml", "spec", "schema"]).stdout) == schema


def test_spec_reads_stdin(cli: Cli, write_spec: WriteSpec) -> None:
    from click.testing import CliRunner

    from tpuctl.cli.main import run

    runner = CliRunner()
    with runner.isolation(input=write_spec().read_text()) as streams:
        code = run(["validate", "-"])
        sys.stdout.flush()
        assert code == 0
        assert streams[0].getvalue().decode().startswith("- is valid: demo")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0.5", 0.5),
        ("90s", 90.0),
        ("1h30m", 5400.0),
        ("20", 20.0),
        ("1.5h", 5400.0),
        ("850ms", 0.85),
        ("1m30.5s", 90.5),
    ],
)
def test_duration_option_takes_the_one_duration_grammar(text: str, seconds: float) -> None:
    from tpuctl.cli.options import DURATION

    assert DURATION.convert(text, None, None) == seconds


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0", "not a positive duration"),
        ("-1", "cannot be negative"),
        ("nan", "not a duration"),
        ("soon", "not a duration"),
        ("1h-5m", "not a duration"),
        ("", "an empty duration"),
    ],
)
def test_duration_option_refuses_what_is_not_a_positive_duration(text: str, fragment: str) -> None:
    import click

    from tpuctl.cli.options import DURATION

    with pytest.raises(click.BadParameter, match=fragment) as refused:
        DURATION.convert(text, None, None)
    assert "write e.g. 90s, 10m, 1.5h" in str(refused.value)  # and how to write one


def test_plan_reads_its_seconds_flags_as_durations(cli: Cli, write_spec: WriteSpec) -> None:
    args = ["plan", str(write_spec()), "--format", "json", "--mtbf", "24h"]
    in_seconds = cli([*args, "--save-seconds", "90", "--restart-seconds", "600"])
    assert in_seconds.exit_code == 0, in_seconds.stderr
    in_units = cli([*args, "--save-seconds", "1m30s", "--restart-seconds", "10m"])
    assert in_units.exit_code == 0, in_units.stderr
    assert json.loads(in_units.stdout) == json.loads(in_seconds.stdout)
    assert json.loads(in_units.stdout)["checkpoint"]["save_seconds"] == 90
    refused = cli([*args, "--step-seconds", "fast"])
    assert refused.exit_code == 2
    assert "--step-seconds" in refused.stderr and "not a duration: 'fast'" in refused.stderr


@pytest.mark.parametrize(
    ("zone", "warned"), [("us-central2-b", True), ("us-central1-a", False)], ids=["far", "near"]
)
def test_plan_online_reads_where_the_checkpoint_bucket_is(
    cli: Cli, write_spec: WriteSpec, gcs_bucket: str, zone: str, warned: bool
) -> None:
    """fake-gcs-server puts every bucket in US-CENTRAL1 (a region)."""
    text = HEAD + GOOD_TPU + f"checkpoint:\n  dir: gs://{gcs_bucket}/ckpt\n"
    args = ["plan", str(write_spec(text)), "--online", "--zone", zone, "--format", "json"]
    outcome = cli(args)
    assert outcome.exit_code == 0, outcome.stderr
    bucket = json.loads(outcome.stdout)["bucket"]
    assert bucket["bucket"] == f"gs://{gcs_bucket}"
    assert (bucket["location"], bucket["location_type"]) == ("US-CENTRAL1", "region")
    assert bucket["ok"] is not warned
    if warned:
        assert outcome.stderr == (
            f"warning: checkpoint bucket gs://{gcs_bucket} is in US-CENTRAL1 (region), the "
            "slices in us-central2: every save and restore crosses regions (slower, and billed "
            "as network egress); use a bucket in us-central2\n"
        )
    else:
        assert outcome.stderr == ""
    offline = cli(["plan", str(write_spec(text)), "--format", "json"])
    assert json.loads(offline.stdout)["bucket"] is None
    assert "plan --online" in " ".join(json.loads(offline.stdout)["notes"])


def test_plan_online_needs_a_zone(cli: Cli, write_spec: WriteSpec, gcs_bucket: str) -> None:
    text = HEAD + GOOD_TPU + f"checkpoint:\n  dir: gs://{gcs_bucket}/ckpt\n"
    outcome = cli(["plan", str(write_spec(text)), "--online"], env={"TPUCTL_ZONE": None})
    assert outcome.exit_code == 2 and outcome.stdout == ""
    assert "needs the slices' zone" in outcome.stderr
