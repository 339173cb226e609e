"""The emulator's HTTP servers sleep between requests and still stop at once."""

from __future__ import annotations

import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


@pytest.mark.timeout(20)  # a stop that waited for the idle poll would take a minute
def test_a_server_serves_then_stops_long_before_its_idle_poll() -> None:
    assert IDLE_POLL_SECONDS >= 30  # otherwise the emulator wakes up for nothing again
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = serve_in_thread(server, "test-http")
    host, port = server.server_address[:2]
    with urllib.request.urlopen(f"http://{host!s}:{port}/", timeout=10) as answer:
        assert answer.read() == b"hello"
    stop_serving(server, thread)
    thread.join(10)
    assert not thread.is_alive()
    assert server.socket.fileno() == -1  # the listening socket is closed too
