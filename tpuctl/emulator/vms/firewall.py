"""The VPC firewall in front of emulated workers that have no external IP address.

On Cloud TPU a node created with `network_config.enable_external_ips: false` is reachable only
from inside its VPC, and, when a firewall rule admits it, from IAP's TCP forwarding range
(35.235.240.0/20), which `gcloud compute start-iap-tunnel` connects from. The emulator's workers
all live on loopback, so it draws the same line by source address: SSH is admitted from the
emulated IAP range 127.235.240.0/20 (no worker address is ever in 127.235.0.0/16) and from any
worker of the emulator (the same VPC: a bastion, or one worker reaching another); every other
connection is dropped the way a GCE firewall drops it: nothing answers, and the client times out.

A kernel accepts a TCP connection before any program sees it, so the emulator cannot refuse
the SYN itself: it accepts, then never says a word (no SSH banner, nothing read) until the
client gives up. A client sees a connect that succeeded and an SSH handshake that times out,
where on Cloud TPU the TCP connect itself times out; both are a timeout with no answer.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

# The emulated IAP TCP forwarding range (the real one is 35.235.240.0/20).
IAP_RANGE = ipaddress.ip_network("127.235.240.0/20")
# Worker addresses (127.<octet>.x.y) never use this second octet, so no worker is "IAP".
RESERVED_OCTET = 235


def from_iap(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in IAP_RANGE
    except ValueError:
        return False


class GuardedListener(socket.socket):
    """A listening socket whose accept() returns only connections `admits(source)` lets in;
    the others go to `drop` (which holds them open and silent) and accepting carries on.

    asyncio's accept loop calls `accept()` on the very socket object given to
    `create_server(sock=…)`, so an SSH server built on it never sees a refused connection.
    """

    def __init__(
        self,
        admits: Callable[[str], bool],
        drop: Callable[[socket.socket], None],
        family: int = socket.AF_INET,
    ) -> None:
        super().__init__(family, socket.SOCK_STREAM)
        self._admits = admits
        self._drop = drop

    def accept(self) -> tuple[socket.socket, object]:
        while True:
            connection, address = super().accept()  # BlockingIOError once none is waiting
            source = address[0] if isinstance(address, tuple) else ""
            if self._admits(source):
                return connection, address
            self._drop(connection)


def listener(
    ip: str, port: int, admits: Callable[[str], bool], drop: Callable[[socket.socket], None]
) -> GuardedListener:
    """A GuardedListener bound to ip:port (asyncio's create_server makes it listen)."""
    sock = GuardedListener(admits, drop)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((ip, port))
    except BaseException:
        sock.close()
        raise
    return sock
