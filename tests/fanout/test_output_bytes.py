"""What workers print reaches files byte for byte, and a line with no end never piles up."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from tests.harness import QR, Project
from tests.support import wait_for
from tpuctl.fanout.engine import CUT_MARK, LINE_LIMIT


def test_output_dir_files_hold_exactly_the_bytes_sent(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    """No newline appended, binary untouched: a captured tar.gz still unpacks."""
    home = qr.home(0, 0)
    (home / "data").mkdir(parents=True, exist_ok=True)
    (home / "data" / "a.txt").write_text("alpha\n")
    (home / "data" / "b.bin").write_bytes(bytes(range(256)) * 40)
    out = tmp_path / "captured"
    command = "tar -czf - -C ~/data . | cat; printf 'tail with no newline' >&2"
    outcome = tpuctl(
        "ssh", qr.name, "--node", "0", "--worker", "0", "--output-dir", str(out), "--", command
    )
    assert outcome.exit_code == 0, outcome.stderr
    archive = (out / f"{qr.node_ids[0]}-w0.out").read_bytes()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as unpacked:
        member = unpacked.extractfile("./b.bin")
        assert member is not None and member.read() == bytes(range(256)) * 40
    assert (out / f"{qr.node_ids[0]}-w0.err").read_bytes() == b"tail with no newline"


def test_a_line_with_no_end_is_passed_on_in_pieces(tpuctl: Project, qr: QR) -> None:
    """8 MiB without a newline: pieces of at most LINE_LIMIT bytes, each marked as cut, and
    nothing lost."""
    size = 8 * 1024 * 1024
    command = f"head -c {size} /dev/zero | tr '\\0' x; echo; echo after"
    outcome = tpuctl("ssh", qr.name, "--node", "0", "--worker", "0", "--", command)
    assert outcome.exit_code == 0, outcome.stderr
    prefix = "[0/0] "
    lines = [line for line in outcome.stdout.splitlines() if line.startswith(prefix)]
    pieces = [line[len(prefix) :] for line in lines]
    mark = CUT_MARK.decode().rstrip("\n")
    cut = [piece for piece in pieces if piece.endswith(mark)]
    # Every piece held back was cut at LINE_LIMIT; the last one may end with its newline.
    assert size // LINE_LIMIT - 1 <= len(cut) <= size // LINE_LIMIT
    assert all(len(piece) == LINE_LIMIT + 1 for piece in cut)
    assert max(len(piece) for piece in pieces) <= 2 * LINE_LIMIT
    assert "".join(piece.removesuffix(mark) for piece in pieces[:-1]) == "x" * size
    assert pieces[-1] == "after"


# Colour, a window-title sequence with a bell, a clear-screen, and a byte that is not UTF-8.
HOSTILE = r"printf 'a \033[31mred\033[0m \033]0;title\007 \033[2J \377end\n'"
ESCAPED = "a \\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 \\x1b[2J "


def test_a_workers_escape_sequences_reach_tables_escaped(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    """A table's last-output column never passes a worker's control sequences to the terminal."""
    files = str(tmp_path / "out")
    args = ("--node", "0", "--worker", "0")
    ran = tpuctl("ssh", qr.name, *args, "--output-dir", files, "--", HOSTILE)
    assert ran.exit_code == 0, ran.stderr
    row = next(line for line in ran.stdout.splitlines() if line.startswith("0/0 "))
    assert row.endswith(ESCAPED + "\\xffend"), row
    assert "\x1b" not in ran.stdout and "\x07" not in ran.stdout

    detach = ("--detach", "--format", "json")
    started = tpuctl("ssh", qr.name, *args, *detach, "--", HOSTILE + "; sleep 30")
    assert started.exit_code == 0, started.stderr
    run = ("--run", started.json()["run"])
    try:
        wait_for(
            lambda: tpuctl("ps", qr.name, *args, *run, "--format", "json").json()["workers"][0][
                "detail"
            ]["last_line"],
            15,
            "the run's output",
        )
        listed = tpuctl("ps", qr.name, *args, *run)
        row = next(line for line in listed.stdout.splitlines() if line.startswith("0/0 "))
        assert ESCAPED in row and "\x1b" not in listed.stdout, row
    finally:
        tpuctl("stop", qr.name, *args, *run, "--grace", "1")
