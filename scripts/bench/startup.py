#!/usr/bin/env python3
"""Start-up time of tpuctl's offline commands against `python -c "import click"`, side by side."""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY_MODULES = ("grpc", "google.cloud", "google.auth", "paramiko", "rich", "yaml")
HELP_RATIO_TARGET = 2.0  # `tpuctl --help` median ≤ 2× the baseline's
RENDER_SECONDS_TARGET = 1.0  # `tpuctl render` median ≤ 1 s

FALLBACK_SPEC = """\
apiVersion: tpuctl/v1
name: bench
tpu:
  accelerator: v4-16
  runtime: tpu-ubuntu2204-base
  slices: 2
capacity:
  tier: spot
job:
  command: python3 train.py
"""

# tpuctl's entry point without its last step (tpuctl.cli.main.no_last_collection): what a
# command costs when the interpreter's garbage collection at exit walks all it made.
WITH_EXIT_COLLECTION = (
    "import sys\n"
    "from tpuctl.cli.main import fewer_collections, run\n"
    "fewer_collections()\n"
    "sys.exit(run(sys.argv[1:]))\n"
)

# Imports nothing itself; reports which heavy modules the tpuctl call pulled in.
PROBE = """
import json, sys
from tpuctl.cli.main import run
code = run(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\nIMPORTED " + json.dumps(sorted(sys.modules)) + "\\n")
"""


@dataclass
class Case:
    name: str
    argv: list[str]
    seconds: list[float]

    def median(self) -> float:
        return statistics.median(self.seconds)

    def p90(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]  # nearest rank


def environment() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    environ["PYTHONPATH"] = str(ROOT)
    return environ


def pick_spec(python: str, scratch: Path) -> tuple[Path, str]:
    """The first configs/*.yaml that validates, else a small spec written to `scratch`."""
    for candidate in sorted((ROOT / "configs").glob("*.yaml")):
        done = subprocess.run(
            [python, "-m", "tpuctl", "validate", str(candidate)],
            capture_output=True,
            env=environment(),
            check=False,
        )
        if done.returncode == 0:
            return candidate, str(candidate.relative_to(ROOT))
    fallback = scratch / "bench.yaml"
    fallback.write_text(FALLBACK_SPEC, encoding="utf-8")
    return fallback, "a temporary spec (no configs/*.yaml validated)"


def time_once(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environment(), check=False
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()}")
    return elapsed


def heavy_imports(python: str, args: list[str]) -> list[str]:
    done = subprocess.run(
        [python, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        env=environment(),
        check=False,
    )
    loaded = set(json.loads(done.stderr.rsplit("IMPORTED ", 1)[-1]))
    return [name for name in HEAVY_MODULES if name in loaded]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15, help="Runs of each command (15).")
    parser.add_argument("--python", default=sys.executable, help="Interpreter to time.")
    parser.add_argument(
        "--check", action="store_true", help="Exit 1 when a target is missed (else just report)."
    )
    args = parser.parse_args()
    python: str = args.python

    with tempfile.TemporaryDirectory() as scratch:
        spec, spec_label = pick_spec(python, Path(scratch))
        tpuctl = [python, "-m", "tpuctl"]
        render_args = ["render", str(spec), "--project", "bench-project", "--zone", "us-central2-b"]
        cases = [
            Case("baseline: python -c 'import click'", [python, "-c", "import click"], []),
            Case("tpuctl --help", [*tpuctl, "--help"], []),
            Case("tpuctl render", [*tpuctl, *render_args], []),
            Case("tpuctl validate", [*tpuctl, "validate", str(spec)], []),
            Case(
                "tpuctl render, exit collection kept",
                [python, "-c", WITH_EXIT_COLLECTION, *render_args],
                [],
            ),
        ]
        for case in cases:  # warm the page cache and bytecode; not counted
            time_once(case.argv)
        # Interleaved, so drift in machine load hits every command alike.
        for _ in range(args.repeat):
            for case in cases:
                case.seconds.append(time_once(case.argv))
        imports = {
            "tpuctl --help": heavy_imports(python, ["--help"]),
            "tpuctl render": heavy_imports(python, render_args),
            "tpuctl validate": heavy_imports(python, ["validate", str(spec)]),
        }

    baseline = cases[0].median()
    print(
        f"spec: {spec_label}; {args.repeat} interleaved runs each; python {sys.version.split()[0]}"
    )
    print(f"{'command':<38} {'median':>9} {'p90':>9} {'× baseline':>11}")
    for case in cases:
        print(
            f"{case.name:<38} {case.median() * 1000:>7.0f}ms {case.p90() * 1000:>7.0f}ms "
            f"{case.median() / baseline:>10.2f}×"
        )
    print()
    for name, heavy in imports.items():
        shown = ", ".join(heavy) if heavy else "none of " + ", ".join(HEAVY_MODULES)
        print(f"{name} imported: {shown}")

    kept = cases[4].median()
    print(
        f"\nthe exit collection: render {cases[2].median() * 1000:.0f} ms without it, "
        f"{kept * 1000:.0f} ms with it ({kept / cases[2].median():.2f}×)"
    )
    help_ratio = cases[1].median() / baseline
    render_median = cases[2].median()
    missed = []
    if help_ratio > HELP_RATIO_TARGET:
        missed.append(f"--help is {help_ratio:.2f}× the baseline (target ≤ {HELP_RATIO_TARGET}×)")
    if render_median > RENDER_SECONDS_TARGET:
        missed.append(f"render median {render_median:.2f} s (target ≤ {RENDER_SECONDS_TARGET} s)")
    print()
    for line in missed:
        print(f"target missed: {line}")
    if not missed:
        print(
            f"targets met: --help {help_ratio:.2f}× baseline (≤ {HELP_RATIO_TARGET}×), "
            f"render {render_median:.2f} s (≤ {RENDER_SECONDS_TARGET} s)"
        )
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
