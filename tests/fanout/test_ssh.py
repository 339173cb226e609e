"""tpuctl ssh against the emulator: output, exit codes and the result table from every worker."""

from __future__ import annotations

import stat
from typing import Any

from tests.harness import QR, Project, by_label


def test_every_worker_of_a_multislice_qr_runs_the_command(tpuctl: Project, qr: QR) -> None:
    out = tpuctl("ssh", qr.name, "--", "echo hello from $TPUCTL_EMULATED_WORKER")
    assert out.exit_code == 0, out.stderr
    for slice_index, node_id in enumerate(qr.node_ids):
        for worker in range(qr.workers_per_node):
            assert f"[{slice_index}/{worker}] hello from {node_id}/{worker}" in out.stdout
    # The key was created like gcloud's, private and 0600.
    key = tpuctl.home / ".ssh" / "google_compute_engine"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert (key.parent / "google_compute_engine.pub").read_text().startswith("ssh-ed25519 ")


def test_json_result_has_one_entry_per_worker(tpuctl: Project, qr: QR) -> None:
    out = tpuctl("ssh", qr.name, "--format", "json", "--", "echo out; echo err >&2; exit 0")
    assert out.exit_code == 0, out.stderr
    data: dict[str, Any] = out.json()
    assert [f"{w['slice']}/{w['worker']}" for w in data["workers"]] == qr.labels()
    first = data["workers"][0]
    assert set(first) >= {
        "slice", "node", "worker", "address", "exit_code", "duration_s", "status",
        "stdout_tail", "stderr_tail", "error",
    }  # fmt: skip
    assert first["stdout_tail"] == "out" and first["stderr_tail"] == "err"
    assert data["summary"]["ok"] == len(qr.labels()) and data["summary"]["exit_code"] == 0


def test_json_says_how_much_output_its_tails_leave_out(tpuctl: Project, qr: QR) -> None:
    out = tpuctl("ssh", qr.name, "--node", "0", "--worker", "0", "--format", "json", "--",
                 "seq 1 100; echo warned >&2")  # fmt: skip
    assert out.exit_code == 0, out.stderr
    worker = out.json()["workers"][0]
    assert worker["stdout_tail"].splitlines() == [str(i) for i in range(81, 101)]
    written = len("".join(f"{i}\n" for i in range(1, 101)))
    assert (worker["stdout_bytes"], worker["stderr_bytes"]) == (written, len("warned\n"))


def _fail_on(qr: QR, slice_index: int, worker: int, code: int) -> str:
    marker = f"{qr.node_ids[slice_index]}/{worker}"
    test = f'[ "$TPUCTL_EMULATED_WORKER" = {marker} ]'
    return f"if {test}; then echo boom >&2; exit {code}; fi; echo fine"


def test_a_failing_worker_gives_exit_3_and_the_table_names_it(tpuctl: Project, qr: QR) -> None:
    out = tpuctl("ssh", qr.name, "--", _fail_on(qr, 1, 1, 7))
    assert out.exit_code == 3, out.stderr
    row = next(line for line in out.stderr.splitlines() if line.startswith("1/1 "))
    assert "FAILED" in row and " 7 " in row
    assert "1/1" in out.stderr  # the error line names the worker
    healthy = by_label(tpuctl("ssh", qr.name, "--format", "json", "--", _fail_on(qr, 1, 1, 7)))
    assert healthy["1/1"]["exit_code"] == 7 and healthy["1/1"]["stderr_tail"] == "boom"
    assert all(healthy[label]["status"] == "ok" for label in qr.labels() if label != "1/1")


def test_a_script_gets_the_workers_output_alone_on_stdout(tpuctl: Project, qr: QR) -> None:
    """`out=$(tpuctl ssh NAME -- hostname)`: the output lines, not a table after them; the table
    is for people, on stderr. With the output in files, stdout has nothing else: the table."""
    out = tpuctl("ssh", qr.name, "--", "echo $TPUCTL_EMULATED_WORKER")
    assert out.exit_code == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == sorted(
        f"[{s}/{w}] {node}/{w}" for s, node in enumerate(qr.node_ids) for w in range(2)
    )
    assert "WORKER  STATUS" in out.stderr and "4 workers: 4 ok" in out.stderr

    to_files = tpuctl("ssh", qr.name, "--output-dir", str(tpuctl.home / "o"), "--", "true")
    assert to_files.exit_code == 0, to_files.stderr
    assert to_files.stdout.splitlines()[0].startswith("WORKER  STATUS")
    as_json = tpuctl("ssh", qr.name, "--format", "json", "--", "echo x")
    assert as_json.json()["summary"]["ok"] == 4  # one document, nothing else on stdout


def test_selectors_pick_slices_and_workers(tpuctl: Project, qr: QR) -> None:
    out = tpuctl("ssh", qr.name, "--node", "1", "--worker", "0", "--format", "json", "--", "true")
    assert out.exit_code == 0, out.stderr
    assert list(by_label(out)) == ["1/0"]
    bad = tpuctl("ssh", qr.name, "--worker", "5", "--", "true")
    assert bad.exit_code == 2 and "no worker 5" in bad.stderr


def test_output_dir_writes_one_file_per_node_and_worker(tpuctl: Project, qr: QR) -> None:
    target = tpuctl.home / "out"
    out = tpuctl("ssh", qr.name, "--output-dir", str(target), "--", "echo $TPUCTL_EMULATED_WORKER")
    assert out.exit_code == 0, out.stderr
    for slice_index, node_id in enumerate(qr.node_ids):
        for worker in range(qr.workers_per_node):
            text = (target / f"{node_id}-w{worker}.out").read_text()
            assert text == f"{node_id}/{worker}\n", slice_index
    assert "[0/0]" not in out.stdout  # the files got it, not the terminal


def test_key_is_published_once_in_ssh_keys_metadata(tpuctl: Project, qr: QR, emulator: Any) -> None:
    assert tpuctl("ssh", qr.name, "--", "true").exit_code == 0
    assert tpuctl("ssh", qr.name, "--", "true").exit_code == 0
    public = (tpuctl.home / ".ssh" / "google_compute_engine.pub").read_text().split()
    client = emulator.tpu_client()
    for node_id in qr.node_ids:
        node = client.get_node(
            name=f"projects/{qr.project}/locations/us-central2-b/nodes/{node_id}"
        )
        lines = node.metadata["ssh-keys"].splitlines()
        assert lines.count(f"tester:{public[0]} {public[1]} tester") == 1


def test_os_login_is_reported_as_unsupported(tpuctl: Project, qr: QR, emulator: Any) -> None:
    client = emulator.tpu_client()
    name = f"projects/{qr.project}/locations/us-central2-b/nodes/{qr.node_ids[0]}"
    before = dict(client.get_node(name=name).metadata)
    client.update_node(
        request={
            "node": {"name": name, "metadata": {**before, "enable-oslogin": "TRUE"}},
            "update_mask": {"paths": ["metadata"]},
        }
    ).result()
    try:
        out = tpuctl("ssh", qr.name, "--", "true")
    finally:
        client.update_node(
            request={
                "node": {"name": name, "metadata": before},
                "update_mask": {"paths": ["metadata"]},
            }
        ).result()
    assert out.exit_code == 8
    assert "OS Login" in out.stderr


def test_fanout_documents_match_the_contract(tpuctl: Project, qr: QR, tmp_path: Any) -> None:
    """Every fan-out command prints the documented Fanout envelope (docs/output.md)."""
    from tests.cli.test_output_contract import check

    def run(example: str, *args: str) -> dict[str, Any]:
        outcome = tpuctl(args[0], qr.name, "--format", "json", *args[1:])
        assert outcome.exit_code == 0, (args, outcome.stderr)
        document: dict[str, Any] = outcome.json()
        check(document, example, " ".join(args))
        return document

    run("ssh", "ssh", "--", "echo 4")
    started = run("ps", "ssh", "--detach", "--", "sleep 30")
    assert started["operation"] == "detach" and started["run"]
    assert run("ps", "ps")["operation"] == "ps"
    assert run("logs", "logs", "-n", "1")["operation"] == "logs"
    assert run("ps", "stop", "--grace", "1")["operation"] == "stop"
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("a\n")
    uploaded = run("upload", "upload", str(source), "~/src")
    assert uploaded["transfer"]["bytes"] > 0
    downloaded = run("upload", "download", "~/src", str(tmp_path / "back"))
    assert downloaded["transfer"]["files"] >= 1


def test_several_words_after_the_dashes_arrive_as_one_argv(tpuctl: Project, qr: QR) -> None:
    """The example of docs/fanout.md: an argv with a `;` and parentheses inside one word, as
    kubectl exec and docker exec keep it; one word stays a shell line."""
    argv = ["python3", "-c", "import sys; print(len(sys.argv), 'ok (x)')", "a b", "$HOME"]
    outcome = tpuctl("ssh", qr.name, "--node", "0", "--worker", "0", "--", *argv)
    assert outcome.exit_code == 0, outcome.stderr
    assert "[0/0] 3 ok (x)" in outcome.stdout  # the two extra words arrived whole, unexpanded
    line = tpuctl("ssh", qr.name, "--node", "0", "--worker", "0", "--", "echo $((6 * 7)) | cat")
    assert "[0/0] 42" in line.stdout  # one word: a shell command line, run as written


def test_a_misspelt_option_is_an_error_not_part_of_the_command(tpuctl: Project, qr: QR) -> None:
    outcome = tpuctl("ssh", qr.name, "--stdn", "--", "cat")
    assert (
        outcome.exit_code == 2
        and "No such option '--stdn'. Did you mean '--stdin'?" in outcome.stderr
    )
    dashed = tpuctl("ssh", qr.name, "--node", "0", "--worker", "0", "--", "ls", "-la", "/")
    assert dashed.exit_code == 0 and "[0/0] total" in dashed.stdout  # after --, all arrive
