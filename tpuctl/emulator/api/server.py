"""Assemble the emulator (worker plane, state machine, gRPC servers) and run it until stopped."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tpuctl.emulator.api.admin_service import AdminServicer
from tpuctl.emulator.api.compute import ComputeServer
from tpuctl.emulator.api.compute_admin import ComputeAdminServicer
from tpuctl.emulator.api.oslogin_service import OsLoginServicer
from tpuctl.emulator.api.rest import TpuRestApi, TpuRestServer
from tpuctl.emulator.api.rest_call import RequestLog
from tpuctl.emulator.api.service import ApiFaults, TpuServicer
from tpuctl.emulator.control.clock import Clock
from tpuctl.emulator.control.config import EmulatorConfig
from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.plane import WorkerPlaneAPI
from tpuctl.emulator.control.state import CloudTpu
from tpuctl.emulator.vms.access import Access

log = logging.getLogger("tpuctl.emulator")

LISTEN_HOST = "127.0.0.1"
RPC_THREADS = 32


class Emulator:
    """`Emulator(config).start()` → `.host`, `.ssh_port`, `.state_dir`; `.close()` stops it all.

    `plane` and `identity_factory` replace the real worker plane (tests of the control plane
    alone); by default they come from tpuctl.emulator.vms.workers.
    """

    def __init__(
        self,
        config: EmulatorConfig,
        *,
        plane: WorkerPlaneAPI | None = None,
        identity_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.config = config
        self._plane = plane
        self._identity_factory = identity_factory
        self._server: grpc.Server | None = None
        self._cloud: CloudTpu | None = None
        self._events: EventLog | None = None
        self._owns_state_dir = config.state_dir is None
        self.state_dir = Path(config.state_dir) if config.state_dir else Path()
        self.host = ""
        self.ssh_port = 0
        self.faults: ApiFaults | None = None
        self.access = Access()
        self._compute: ComputeServer | None = None
        self.compute_endpoint = ""
        # The Cloud TPU REST API (gcloud's face of the API), over the same control plane.
        self._rest: TpuRestServer | None = None
        self.rest_endpoint = ""
        self.rest_requests = RequestLog()

    @property
    def cloud(self) -> CloudTpu:
        assert self._cloud is not None, "start() first"
        return self._cloud

    def start(self) -> None:
        config = self.config
        if self._owns_state_dir:
            self.state_dir = Path(tempfile.mkdtemp(prefix="tpuctl-emulator-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        clock = Clock(config.speed)
        self._events = EventLog(clock, self.state_dir / "events.jsonl")
        try:
            self._compute = ComputeServer(self.access)
            self._compute.start()
            self.compute_endpoint = self._compute.endpoint
            plane = self._plane or self._real_plane()
            self._plane = plane
            plane.start()
            self.ssh_port = plane.ssh_port
            identity = self._identity_factory or _real_identity()
            self._cloud = CloudTpu(config, plane, self._events, clock, identity)
            self._cloud.project_metadata = self.access.project_metadata
            from tpuctl.emulator.compute.engine import ComputeEngine

            self._compute.attach(
                ComputeEngine(config, plane, self._events, clock, self.access.project_metadata)
            )
            self.faults = ApiFaults(self._events)
            rest_api = TpuRestApi(self._cloud, self.faults.check, self._events, self.rest_requests)
            self._rest = TpuRestServer(rest_api, config.rest_port)
            self._rest.start()
            self.rest_endpoint = self._rest.endpoint
            server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=RPC_THREADS, thread_name_prefix="rpc"),
                options=[("grpc.so_reuseport", 0)],
            )
            port = server.add_insecure_port(f"{LISTEN_HOST}:{config.port}")
            if port == 0:
                raise OSError(f"cannot listen on {LISTEN_HOST}:{config.port}")
            self.host = f"{LISTEN_HOST}:{port}"
            info = {
                "host": self.host,
                "ssh_port": self.ssh_port,
                "compute_endpoint": self.compute_endpoint,
                "rest_endpoint": self.rest_endpoint,
                "state_dir": str(self.state_dir),
                "grace": config.grace,
            }
            admin = AdminServicer(self._cloud, self.faults, self._events, info, self.access)
            admin.rest_requests = self.rest_requests
            server.add_generic_rpc_handlers(
                [
                    *TpuServicer(self._cloud, self.faults).handlers(),
                    OsLoginServicer(self.access, self.faults.check).handler(),
                    admin.handler(),
                    ComputeAdminServicer(self._compute).handler(),
                ]
            )
            server.start()
            self._server = server
        except BaseException:
            self.close()
            raise
        self._events.emit(
            "emulator.start", detail=f"{self.host} ssh:{self.ssh_port} rest:{self.rest_endpoint}"
        )

    def close(self) -> None:
        """Stop serving, kill every worker process, remove a temporary state dir. Idempotent."""
        if self._server is not None:
            self._server.stop(grace=0.5).wait(5)
            self._server = None
        if self._rest is not None:
            self._rest.close()
            self._rest = None
        if self._cloud is not None:
            self._cloud.close()
            self._cloud = None
        if self._compute is not None and self._compute.engine is not None:
            self._compute.engine.close()  # its flows stop before the worker plane goes
        if self._plane is not None:
            try:
                self._plane.close()
            except Exception:
                log.exception("closing the worker plane failed")
            self._plane = None
        if self._events is not None:
            self._events.close()
            self._events = None
        if self._compute is not None:
            self._compute.close()
            self._compute = None
        if self._owns_state_dir and self.state_dir != Path():
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _real_plane(self) -> WorkerPlaneAPI:
        from tpuctl.emulator.vms.workers import WorkerPlane

        plane: WorkerPlaneAPI = WorkerPlane(
            self.state_dir,
            ssh_port=self.config.ssh_port,
            speed=self.config.speed,
            ssh_server=self.config.ssh_server,
            access=self.access,
        )
        return plane


def _real_identity() -> Callable[..., Any]:
    from tpuctl.emulator.vms.workers import NodeIdentity

    factory: Callable[..., Any] = NodeIdentity
    return factory


def serve_until_signalled(config: EmulatorConfig, announce: Callable[[Emulator], None]) -> None:
    """Run an emulator in the foreground until SIGINT or SIGTERM, then stop every worker
    process; `announce` is told once it is up (the lines to export)."""
    import select
    import signal

    stopping: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda number, _frame: stopping.append(number))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    # Whichever thread the kernel hands the signal to writes a byte here, so the main thread
    # sleeps in select() until then instead of waking every half second to look.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    previous_wakeup = signal.set_wakeup_fd(wake_write)
    emulator = Emulator(config)
    try:
        emulator.start()
        announce(emulator)
        while not stopping:
            select.select([wake_read], [], [])
            os.read(wake_read, 512)
    finally:
        emulator.close()
        signal.set_wakeup_fd(previous_wakeup)
        os.close(wake_read)
        os.close(wake_write)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
