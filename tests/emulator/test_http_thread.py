"""The emulator's HTTP servers sleep between requests and still stop at once."""

from __future__ import annotations

import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tpuctl.emulator.api.http_thread import IDLE_POLL_SECONDS, serve_in_thread, stop_serving


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, format: str, *args: object) -> None:
        pass


def _times_run(thread_id: int) -> int:
    """How many times the kernel has put the thread on a CPU (/proc schedstat's third field)."""
    return int(Path(f"/proc/self/task/{thread_id}/schedstat").read_text().split()[2])


@pytest.mark.timeout(20)  # a stop that waited for the idle poll would take a minute
def test_a_server_sleeps_between_requests_and_stops_long_before_its_idle_poll() -> None:
    assert IDLE_POLL_SECONDS >= 30  # otherwise the emulator wakes up for nothing again
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = serve_in_thread(server, "test-http")
    host, port = server.server_address[:2]
    with urllib.request.urlopen(f"http://{host!s}:{port}/", timeout=10) as answer:
        assert answer.read() == b"hello"
    # At rest the serving thread is not run at all: serve_forever's 0.2 s poll ran it about
    # 7 times in this second and a half. (A count of wake-ups, not a time.)
    assert thread.native_id is not None
    before = _times_run(thread.native_id)
    time.sleep(1.5)
    assert _times_run(thread.native_id) - before <= 1
    stop_serving(server, thread)
    thread.join(10)
    assert not thread.is_alive()
    assert server.socket.fileno() == -1  # the listening socket is closed too
