"""Reading a spec stops at the size limit: an endless stdin or FIFO is refused after about a
megabyte, never read to its end (tpuctl.spec.load)."""

from __future__ import annotations

import contextlib
import io
import os
import threading
from pathlib import Path

import pytest

from tpuctl.errors import ExitCode, SpecError
from tpuctl.spec.load import load_spec
from tpuctl.spec.yamlsource import MAX_SPEC_CHARS

# Far past the limit, still small: a reader that got this far did not stop at the limit.
TRIPWIRE = 8 * MAX_SPEC_CHARS
LINE = b"# a comment line, repeated for ever\n"


class EndlessSpec(io.RawIOBase):
    """A stream that never ends (like `yes`), counting what it served; past TRIPWIRE it fails
    the test instead of letting the reader grow without bound."""

    def __init__(self) -> None:
        self.served = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        assert self.served < TRIPWIRE, f"read {self.served} bytes: the reader did not stop"
        size = len(buffer)
        chunk = (LINE * (size // len(LINE) + 1))[:size]
        buffer[:size] = chunk
        self.served += size
        return size


def test_an_endless_stdin_is_refused_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    source = EndlessSpec()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BufferedReader(source), "utf-8"))
    with pytest.raises(SpecError) as raised:
        load_spec("-")
    error = raised.value
    assert error.exit_code is ExitCode.USAGE
    line = error.one_line()
    assert line.startswith("<stdin>: ") and "\n" not in line
    assert "1 MiB" in line
    assert source.served < 2 * MAX_SPEC_CHARS


@pytest.mark.timeout(60)
def test_a_fifo_that_never_ends_is_refused_without_reading_to_its_end(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    written = [0]

    def write_for_ever() -> None:
        # The reader stopping and closing its end is what we want: the pipe breaks in a write,
        # or in the close that flushes what is still buffered.
        with contextlib.suppress(BrokenPipeError), open(fifo, "wb") as stream:
            while written[0] < TRIPWIRE:  # then EOF: an unbounded reader ends there
                stream.write(LINE * 1024)
                written[0] += len(LINE) * 1024

    writer = threading.Thread(target=write_for_ever, daemon=True)
    writer.start()
    with pytest.raises(SpecError) as raised:
        load_spec(fifo)
    writer.join()
    line = raised.value.one_line()
    assert line.startswith(f"{fifo}: ") and "1 MiB" in line
    assert written[0] < TRIPWIRE, "the spec was read to its end, not stopped at the limit"


def test_a_file_just_under_the_limit_is_read(tmp_path: Path, minimal: str) -> None:
    path = tmp_path / "big.yaml"
    padding = "#" * 99 + "\n"
    body = minimal.encode()
    count = (MAX_SPEC_CHARS - len(body)) // len(padding)
    path.write_bytes(body + padding.encode() * count)
    assert load_spec(path).spec.name == "demo"
    path.write_bytes(body + padding.encode() * (count + 1))
    with pytest.raises(SpecError, match="1 MiB"):
        load_spec(path)
