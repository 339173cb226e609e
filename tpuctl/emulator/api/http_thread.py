"""The emulator's HTTP servers (the TPU API's REST face, the Compute Engine fake) each on a
thread that sleeps until a request comes or the server is stopped.

`serve_forever(poll_interval)` wakes its thread every `poll_interval` only to see whether
`shutdown()` was asked for: at 0.2 s, two servers woke an idle emulator 10 times a second, and
with its main thread's half-second wait it took 2.3–2.5× the CPU of a bare gRPC server at rest,
1.1–1.4× since (`scripts/bench/emulator.py`, its `idle` case). Here the poll is a minute long,
and `stop_serving` wakes the loop at once by connecting to it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from socketserver import TCPServer

IDLE_POLL_SECONDS = 60.0


def serve_in_thread(server: TCPServer, name: str) -> threading.Thread:
    """Start serving `server` on a daemon thread called `name`."""
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": IDLE_POLL_SECONDS},
        name=name,
        daemon=True,
    )
    thread.start()
    return thread


def stop_serving(server: TCPServer, thread: threading.Thread | None) -> None:
    """Stop the loop `serve_in_thread` started and close the listening socket. `shutdown()`
    waits for the loop to see its request, so the loop is woken with a connection that sends
    nothing (the handler reads no request line and closes it)."""
    if thread is not None and thread.is_alive():
        stopping = threading.Thread(target=server.shutdown, name="http-shutdown", daemon=True)
        stopping.start()
        host, port = server.server_address[:2]
        while stopping.is_alive():
            with contextlib.suppress(OSError):
                socket.create_connection((str(host), port), timeout=1).close()
            stopping.join(0.05)
    server.server_close()
