"""A stand-in for `gcloud` in tests: only `compute start-iap-tunnel INSTANCE PORT
--listen-on-stdin --project P --zone Z [--verbosity V]`, doing what IAP does for it.

It finds the worker whose `hostname` guest attribute is INSTANCE through the emulator's REST
API at $CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU (as gcloud would ask Compute Engine), connects to
its internal IP and PORT from an address in the emulated IAP range (127.235.240.0/20, which
the emulator's firewall admits), and pumps bytes between its stdin
and stdout and that connection until either side ends. Errors go to stderr the way gcloud
prints them, with exit 1.

For tests, from the environment:
- GCLOUD_STANDIN_LOG: a file it appends one JSON line to per run ({"argv": [...], "pid": N});
- GCLOUD_STANDIN_FAIL: an instance name (or `*`) for which it says IAP's "failed to connect
  to backend" error on stderr and exits 1 before connecting;
- GCLOUD_STANDIN_HANG: an instance name (or `*`) for which it never answers (sleeps);
- GCLOUD_STANDIN_NO_LOGIN: any value: it says what gcloud says with no active account
  (NO_CREDENTIALS) and exits 1, as gcloud does before opening any tunnel.

`install(directory)` writes an executable `gcloud` there that runs this file with the test's
Python.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import socket
import sys
import time
from pathlib import Path

PREFIX = "ERROR: (gcloud.compute.start-iap-tunnel)"
BACKEND_FAILED = f"{PREFIX} Error while connecting [4003: 'failed to connect to backend']."
NO_CREDENTIALS = (
    f"{PREFIX} You do not currently have an active account selected.\n"
    "Please run:\n\n  $ gcloud auth login\n\nto obtain new credentials.\n\n"
    "If you have already logged in with a different account, run:\n\n"
    "  $ gcloud config set account ACCOUNT\n\n"
    "to select an already authenticated account to use."
)


def install(directory: Path) -> Path:
    """An executable `gcloud` in `directory` that runs this stand-in; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "gcloud"
    path.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\n"
        f"sys.argv[0] = {str(path)!r}\n"
        f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def _fail(message: str) -> int:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    return 1


def _worker_address(instance: str, project: str, zone: str) -> str | None:
    """The internal IP of the worker whose `hostname` guest attribute is `instance`, asked of
    the emulator's REST face with the standard library (as gcloud asks Compute Engine): one
    stand-in starts per connection, and loading a Cloud client library in each would cost far
    more than the lookup."""
    import urllib.request

    base = os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"].rstrip("/")
    parent = f"{base}/v2alpha1/projects/{project}/locations/{zone}"

    def call(url: str, body: bytes | None = None) -> dict[str, object]:
        request = urllib.request.Request(url, data=body, method="POST" if body else "GET")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            document: dict[str, object] = json.loads(answer.read())
        return document

    nodes = call(f"{parent}/nodes").get("nodes") or []
    for node in nodes if isinstance(nodes, list) else []:
        attributes = call(f"{base}/v2alpha1/{node['name']}:getGuestAttributes", b"{}")
        for worker, values in enumerate(attributes.get("guestAttributes") or []):  # type: ignore[arg-type]
            for item in values.get("queryValue", {}).get("items", []):
                if item.get("key") == "hostname" and item.get("value") == instance:
                    return str(node["networkEndpoints"][worker]["ipAddress"])
    return None


def _pump(connection: socket.socket) -> int:
    """stdin → connection, connection → stdout, until the connection ends."""
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "stdin")
    selector.register(connection, selectors.EVENT_READ, "worker")
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                data = os.read(0, 65536)
                if not data:  # the SSH client is done: say so to the worker, keep reading
                    selector.unregister(0)
                    connection.shutdown(socket.SHUT_WR)
                    continue
                connection.sendall(data)
            else:
                try:
                    data = connection.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    return 0
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view) :]


def main(argv: list[str]) -> int:
    log = os.environ.get("GCLOUD_STANDIN_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"argv": argv, "pid": os.getpid()}) + "\n")
    if argv[:2] != ["compute", "start-iap-tunnel"]:
        return _fail(f"ERROR: (gcloud) the stand-in only runs compute start-iap-tunnel: {argv}")
    parser = argparse.ArgumentParser(prog="gcloud compute start-iap-tunnel")
    parser.add_argument("instance")
    parser.add_argument("port", type=int)
    parser.add_argument("--listen-on-stdin", action="store_true", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--zone", required=True)
    parser.add_argument("--verbosity", default="warning")
    args = parser.parse_args(argv[2:])
    if os.environ.get("GCLOUD_STANDIN_NO_LOGIN"):
        return _fail(NO_CREDENTIALS)
    if os.environ.get("GCLOUD_STANDIN_FAIL", "") in ("*", args.instance):
        return _fail(BACKEND_FAILED)
    if os.environ.get("GCLOUD_STANDIN_HANG", "") in ("*", args.instance):
        time.sleep(3600)
    address = _worker_address(args.instance, args.project, args.zone)
    if address is None:
        return _fail(
            f"{PREFIX} Could not fetch resource: - The resource 'projects/{args.project}/zones/"
            f"{args.zone}/instances/{args.instance}' was not found"
        )
    source = f"127.235.240.{random.randint(1, 254)}"  # inside the emulated IAP range
    try:
        connection = socket.create_connection(
            (address, args.port), timeout=10, source_address=(source, 0)
        )
    except OSError:
        return _fail(BACKEND_FAILED)
    connection.settimeout(None)
    return _pump(connection)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
