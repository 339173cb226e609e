"""Pure parts of the fan-out: selectors, exit-code precedence, remote quoting."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuctl.errors import ExitCode, UsageError
from tpuctl.fanout import remote
from tpuctl.fanout.connection import ConnectOptions
from tpuctl.fanout.operations import Fleet
from tpuctl.fanout.results import FanoutResult, WorkerResult
from tpuctl.fanout.targets import WorkerTarget, parse_selector, select, ssh_port

TARGETS = [WorkerTarget(s, f"n-{s}", w, f"127.0.{s}.{w + 1}") for s in range(3) for w in range(4)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all", None),
        ("0", {0}),
        ("1,3", {1, 3}),
        ("0-3", {0, 1, 2, 3}),
        (" 0 , 2-3 ", {0, 2, 3}),
        ("5-5", {5}),
    ],
)
def test_parse_selector(text: str, expected: set[int] | None) -> None:
    assert parse_selector(text) == (None if expected is None else frozenset(expected))


@pytest.mark.parametrize("text", ["", "a", "1-", "3-1", "-1", "1,,2", "0x1"])
def test_parse_selector_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_selector(text)


def test_select_by_slice_worker_and_node_id() -> None:
    assert [t.label for t in select(TARGETS, nodes="1", workers="0,3")] == ["1/0", "1/3"]
    assert [t.label for t in select(TARGETS, nodes="n-2", workers="1")] == ["2/1"]
    assert len(select(TARGETS)) == 12
    with pytest.raises(UsageError, match="no slice 7"):
        select(TARGETS, nodes="7")
    with pytest.raises(UsageError, match="no worker 4"):
        select(TARGETS, workers="4")


def test_ssh_port_precedence() -> None:
    assert ssh_port(2222, {"TPUCTL_SSH_PORT": "1"}) == 2222
    assert ssh_port(None, {"TPUCTL_SSH_PORT": "2200"}) == 2200
    assert ssh_port(None, {}) == 22
    with pytest.raises(UsageError):
        ssh_port(None, {"TPUCTL_SSH_PORT": "x"})


def _result(*statuses: str) -> FanoutResult:
    return FanoutResult([WorkerResult(TARGETS[i], s) for i, s in enumerate(statuses)])  # type: ignore[arg-type]


def test_exit_code_precedence() -> None:
    assert _result("ok", "ok").exit_code == ExitCode.OK
    assert _result("ok", "failed").exit_code == ExitCode.COMMAND_FAILED
    assert _result("failed", "timeout").exit_code == ExitCode.DEADLINE
    assert _result("failed", "timeout", "unreachable").exit_code == ExitCode.UNREACHABLE
    assert _result("unreachable", "hostkey-mismatch").exit_code == ExitCode.AUTH
    assert _result("unreachable", "hostkey-unknown").exit_code == ExitCode.AUTH
    assert _result("unreachable", "auth-failed").exit_code == ExitCode.AUTH
    interrupted = _result("ok")
    interrupted.interrupted = True
    assert interrupted.exit_code == ExitCode.INTERRUPTED
    error = _result("ok", "failed").error()
    assert error is not None and "0/1" in error.message


def test_remote_path() -> None:
    assert remote.remote_path("~") == '"$HOME"'
    assert remote.remote_path("~/a b") == "\"$HOME\"/'a b'"
    assert remote.remote_path("/opt/x") == '"${TPUCTL_VM_ROOT:-}"/opt/x'
    assert remote.remote_path("rel") == "rel"
    with pytest.raises(UsageError):
        remote.remote_path("~bob/x")


ENV_NAMES = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
ENV_VALUES = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(ENV_NAMES, ENV_VALUES))
def test_env_values_survive_the_shell_byte_for_byte(env: dict[str, str]) -> None:
    script = remote.env_exports(env) + "env -0"
    shown = subprocess.run(["sh", "-c", script], capture_output=True, env={}, check=True).stdout
    seen = dict(item.split(b"=", 1) for item in shown.split(b"\0") if b"=" in item)
    for name, value in env.items():
        assert seen[name.encode()] == value.encode()


def test_parse_state() -> None:
    state = remote.parse_state("noise\nstate=exited run=r1 pid=12 exit=3\n")
    assert state is not None and (state.state, state.pid, state.exit_code) == ("exited", 12, 3)
    assert remote.parse_state("nothing") is None
    with pytest.raises(UsageError):
        remote.check_run_id("../etc")


def _upload(tmp_path: Path, archive: bytes, digest: str) -> subprocess.CompletedProcess[bytes]:
    script = remote.upload_script(str(tmp_path / "dest"), digest)
    return subprocess.run(
        ["bash", "-c", script], input=archive, capture_output=True, timeout=30, check=False
    )


def test_upload_script_unpacks_only_what_matches_its_checksum(tmp_path: Path) -> None:
    from tpuctl.fanout.operations import pack_local

    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('hi')\n", encoding="utf-8")
    archive = pack_local(source)
    good = _upload(tmp_path, archive, hashlib.sha256(archive).hexdigest())
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "dest" / "train.py").read_text(encoding="utf-8") == "print('hi')\n"
    (tmp_path / "dest" / "train.py").unlink()
    corrupted = archive[:-1] + bytes([archive[-1] ^ 0xFF])
    bad = _upload(tmp_path, corrupted, hashlib.sha256(archive).hexdigest())
    assert bad.returncode == remote.UPLOAD_CHECKSUM_EXIT
    assert b"checksum mismatch" in bad.stderr
    # Nothing was unpacked and the temporary file is gone.
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == []


@pytest.mark.parametrize("kind", ["parent", "absolute", "symlink", "hardlink"])
def test_a_downloaded_archive_never_writes_outside_its_directory(tmp_path: Path, kind: str) -> None:
    """What a worker sends is not trusted: a member that would land outside the download's
    directory, or a hard link, fails that worker; an absolute name lands inside it (its
    leading / dropped, as tar does). Nothing is ever written outside."""
    import io
    import tarfile

    from tpuctl.errors import TpuctlError
    from tpuctl.fanout.operations import _extract

    archive = tmp_path / "sent.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        names = {"parent": "../evil", "absolute": str(tmp_path / "evil")}
        member = tarfile.TarInfo(names.get(kind, "x"))
        if kind == "symlink":
            member.type, member.linkname = tarfile.SYMTYPE, "../../"
        elif kind == "hardlink":
            member.type, member.linkname = tarfile.LNKTYPE, "../evil"
        data = b"owned"
        member.size = len(data) if member.isreg() else 0
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
        if kind == "symlink":
            through = tarfile.TarInfo("x/evil")
            through.size = len(data)
            tar.addfile(through, io.BytesIO(data))
    into = tmp_path / "into"
    if kind == "absolute":
        _extract(archive, into)
        assert (into / str(tmp_path / "evil").lstrip("/")).read_bytes() == b"owned"
    else:
        with pytest.raises((tarfile.TarError, TpuctlError)):
            _extract(archive, into)
        assert not list(into.rglob("evil")) if into.exists() else True
    assert not (tmp_path / "evil").exists()


def test_a_fleet_connecting_within_a_shorter_time_changes_only_that() -> None:
    targets = [WorkerTarget(0, "n", 0, "10.0.0.1")]
    connect = ConnectOptions(user="u", pkey=None, connect_timeout=20.0, keepalive=7.0)
    fleet = Fleet("qr", targets, connect, key=cast(Any, None), user="u")
    short = fleet.connecting_within(5.0)
    assert short.connect.connect_timeout == 5.0 and fleet.connect.connect_timeout == 20.0
    assert short.connect.keepalive == 7.0 and short.targets == targets
    assert fleet.connecting_within(60.0) is fleet  # never longer than the fleet's own
