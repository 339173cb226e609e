"""The TPU API client: the emulator switch, retries, and API errors → tpuctl errors (its
credentials are tpuctl.cloud.credentials)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from tpuctl.cloud.credentials import load_credentials, make_tpu_client
from tpuctl.cloud.resolve import EMULATOR_ENV, Location, is_emulator
from tpuctl.errors import (
    ApiUnavailableError,
    AuthError,
    NotFoundError,
    ResourceExhaustedError,
    TpuctlError,
    UsageError,
)

RETRY_ENV = "TPUCTL_API_RETRY_SECONDS"
# grpc (google-cloud-tpu) or rest (the REST API): the transport of every queued-resource and
# node call; a request carrying fields only REST has goes over REST whatever this says.
TRANSPORT_ENV = "TPUCTL_TPU_TRANSPORT"
TRANSPORTS = ("grpc", "rest")
DEFAULT_RETRY_SECONDS = 60.0
DEFAULT_RPC_TIMEOUT = 30.0


class AlreadyExistsError(TpuctlError):
    """The service said ALREADY_EXISTS; create turns this into its idempotency check."""

    kind = "already_exists"


def retry_seconds(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get(RETRY_ENV)
    if not raw:
        return DEFAULT_RETRY_SECONDS
    try:
        return max(0.0, float(raw))
    except ValueError:
        return DEFAULT_RETRY_SECONDS


# A call failing for longer than this is said on stderr (through TpuApi.on_retry), and again
# every NOTICE_EVERY seconds while it goes on.
NOTICE_AFTER = 3.0
NOTICE_EVERY = 30.0
# A long-running operation is polled after 0.1 s, then each pause doubles up to 1 s: most
# operations end within a second (a create is accepted at once), and a slow one costs at most
# one Get a second, as before.
OPERATION_POLL_FIRST = 0.1
OPERATION_POLL_MAX = 1.0


class RetryNotice:
    """`on_error` of one call's retry: once the call has failed for NOTICE_AFTER seconds, say
    what is being retried and for how long; again every NOTICE_EVERY seconds."""

    def __init__(self, say: Callable[[str], None], what: str, total_seconds: float) -> None:
        self.say = say
        self.what = what
        self.total = total_seconds
        self.first: float | None = None
        self.last: float | None = None

    def __call__(self, error: BaseException) -> None:
        now = time.monotonic()
        self.first = now if self.first is None else self.first
        # A short retry budget is said sooner: its last attempt may come before NOTICE_AFTER.
        if now - self.first < min(NOTICE_AFTER, self.total / 3):
            return
        if self.last is not None and now - self.last < NOTICE_EVERY:
            return
        self.last = now
        self.say(
            f"{self.what}: the TPU API is unavailable ({_status_name(error)}: {_reason(error)}) "
            f"for {now - self.first:.0f} s; retrying for up to {self.total:g} s"
        )


def make_retry(
    *,
    total_seconds: float,
    reads: bool,
    on_error: Callable[[BaseException], None] | None = None,
) -> Any:
    """Retry UNAVAILABLE and DEADLINE_EXCEEDED (and RESOURCE_EXHAUSTED on reads) for a while.

    RESOURCE_EXHAUSTED on a create is quota or an insufficient reservation: retrying would
    only hide it. Permission and argument errors are never retried.
    """
    from google.api_core import exceptions as api_exceptions
    from google.api_core import retry as api_retry

    transient: tuple[type[Exception], ...] = (
        api_exceptions.ServiceUnavailable,
        api_exceptions.DeadlineExceeded,
    )
    if reads:
        transient = (*transient, api_exceptions.ResourceExhausted)
    # google.api_core sleeps a random part of the backoff and gives up when the next sleep
    # would pass the deadline: with a 4 s cap, a 5 s budget could end after 1 s of retries.
    # The cap is a quarter of the budget, so at least three quarters of it are used.
    return api_retry.Retry(
        predicate=api_retry.if_exception_type(*transient),
        initial=0.25,
        maximum=min(4.0, max(0.25, total_seconds / 4)),
        multiplier=2.0,
        timeout=total_seconds,
        on_error=on_error,
    )


@contextmanager
def api_errors(action: str, target: str) -> Iterator[None]:
    """The one place google.api_core exceptions become tpuctl errors (with what to do next)."""
    from google.api_core import exceptions as api_exceptions

    try:
        yield
    except api_exceptions.RetryError as error:
        cause = error.cause
        raise ApiUnavailableError(
            f"{action} {target}: the TPU API kept failing "
            f"({_status_name(cause)}: {_reason(cause)}); gave up retrying",
            hint=f"try again later, or raise {RETRY_ENV}",
            resource=target,
            status=_status_name(cause),
        ) from None
    except (api_exceptions.ServiceUnavailable, api_exceptions.DeadlineExceeded) as error:
        raise ApiUnavailableError(
            f"{action} {target}: the TPU API is unavailable ({_status_name(error)}: "
            f"{_reason(error)})",
            hint=f"try again later, or raise {RETRY_ENV}",
            resource=target,
            status=_status_name(error),
        ) from None
    except api_exceptions.NotFound as error:
        raise NotFoundError(f"{target} not found", hint=_reason(error), resource=target) from None
    except (api_exceptions.PermissionDenied, api_exceptions.Unauthenticated) as error:
        raise AuthError(
            f"{action} {target}: permission denied: {_reason(error)}",
            hint="check the account has roles/tpu.admin in the project, or pass "
            "--impersonate-service-account",
            resource=target,
        ) from None
    except api_exceptions.ResourceExhausted as error:
        # Reads retry it (a rate limit); a write that gets it is refused, not failing.
        what = "no quota or capacity for it" if action == "create" else "a quota or rate limit"
        raise ResourceExhaustedError(
            f"{action} {target}: RESOURCE_EXHAUSTED ({what}): {_reason(error)}",
            hint="try another zone (capacity.zones), another tier, or later; "
            "check quota with: tpuctl doctor SPEC"
            if action == "create"
            else "try again later",
            resource=target,
            status=_status_name(error),
        ) from None
    except api_exceptions.AlreadyExists as error:
        raise AlreadyExistsError(f"{target} already exists: {_reason(error)}") from None
    except (api_exceptions.InvalidArgument, api_exceptions.FailedPrecondition) as error:
        raise TpuctlError(
            f"{action} {target}: the TPU API refused: {_reason(error)}",
            hint=_explain(action, error),
            resource=target,
            status=_status_name(error),
        ) from None
    except api_exceptions.GoogleAPICallError as error:
        raise TpuctlError(
            f"{action} {target}: {_status_name(error)}: {_reason(error)}", resource=target
        ) from None


def _reason(error: BaseException | None) -> str:
    if error is None:
        return "no reason given"
    message = getattr(error, "message", None) or str(error)
    return str(message).strip() or type(error).__name__


def _status_name(error: Any) -> str:
    code = getattr(error, "grpc_status_code", None)
    return str(getattr(code, "name", None) or type(error).__name__)


def _explain(action: str, error: Any) -> str | None:
    """What a person should do about the service's FAILED_PRECONDITION / INVALID_ARGUMENT."""
    from google.api_core import exceptions as api_exceptions

    text = _reason(error).lower()
    if isinstance(error, api_exceptions.FailedPrecondition):
        if action == "delete":
            return "the queued resource still has nodes: pass --force to delete them with it"
        if action == "reset":
            return "only an ACTIVE queued resource can be reset; see 'tpuctl status'"
    if action == "create" and "multislice" in text:
        return "multislice needs v4 or newer"
    return None


class CallBudget:
    """The timeout of one API call, retries included (google.api_core applies it to every
    attempt): each attempt gets the per-call timeout, cut to what is left of the retry
    budget, so a hung API never holds a call past the budget. A budget of 0 (no retries)
    leaves the one attempt its per-call timeout."""

    SHORTEST = 0.05  # an attempt that starts at the budget's end fails at once

    def __init__(self, budget: float, per_call: float) -> None:
        self.budget = budget if budget > 0 else per_call
        self.per_call = per_call

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        deadline = time.monotonic() + self.budget

        def attempt(*args: Any, **kwargs: Any) -> Any:
            left = deadline - time.monotonic()
            kwargs["timeout"] = max(self.SHORTEST, min(self.per_call, left))
            return func(*args, **kwargs)

        return attempt


@dataclass
class TpuApi:
    """The calls tpuctl makes, with retries, timeouts and error mapping applied uniformly.

    `client` is a `tpu_v2alpha1.TpuClient` (typed Any: the generated client has no stubs);
    `rest` the REST face with the same methods (tpuctl.cloud.rest.RestTpuClient), None where
    it cannot be reached (the emulator without its REST endpoint). Queued-resource and node
    calls go over `transport`; a create whose request carries fields only REST has goes over
    REST, and `over_rest()` is the same API reading over REST (what only REST answers:
    a flex-start run's termination time, …).
    """

    client: Any
    location: Location
    retry_total: float = DEFAULT_RETRY_SECONDS
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT
    # Told (a line for people) when a call has kept failing for a few seconds.
    on_retry: Callable[[str], None] | None = None
    impersonate: str | None = None  # the service account acted as, for the other APIs
    rest: Any = None
    transport: str = "grpc"
    # Where slices come from: "tpu" (queued resources) or "compute" (Compute Engine instances
    # and MIGs behind the same face, tpuctl.cloud.compute).
    api: str = "tpu"

    def _rest_client(self, why: str) -> Any:
        if self.rest is None:
            from tpuctl.cloud.rest import ENDPOINT_ENV

            raise TpuctlError(
                f"{why}, and the REST API cannot be reached: {ENDPOINT_ENV} is unset while "
                f"{EMULATOR_ENV} points at an emulator",
                hint="export what `tpuctl emulator env` prints (its REST endpoint too)",
            )
        return self.rest

    def _calls(self) -> Any:
        """The client queued-resource and node calls go through."""
        if self.transport == "rest":
            return self._rest_client(f"{TRANSPORT_ENV}=rest asks for the REST API")
        return self.client

    def over_rest(self) -> TpuApi:
        """The same API, its queued-resource and node calls over REST (Compute Engine's
        answers carry every field already: the same API)."""
        if self.api == "compute":
            return self
        return replace(self, transport="rest")

    def _notice(self, what: str) -> Callable[[BaseException], None] | None:
        return None if self.on_retry is None else RetryNotice(self.on_retry, what, self.retry_total)

    @property
    def timeout(self) -> CallBudget:
        """The `timeout=` of every call: the per-call timeout within the retry budget."""
        return CallBudget(self.retry_total, self.rpc_timeout)

    def _read_retry(self, what: str = "reading") -> Any:
        return make_retry(total_seconds=self.retry_total, reads=True, on_error=self._notice(what))

    def _write_retry(self, what: str = "writing") -> Any:
        return make_retry(total_seconds=self.retry_total, reads=False, on_error=self._notice(what))

    def with_retry(self, seconds: float) -> TpuApi:
        """The same API whose calls retry for at most `seconds` (a poll inside a wait that
        rides out an outage itself)."""
        return replace(self, retry_total=seconds)

    def in_zone(self, zone: str) -> TpuApi:
        """The same client, speaking about another zone of the same project."""
        return replace(self, location=replace(self.location, zone=zone, zone_source="flag"))

    def list_zones(self) -> list[str]:
        """Every zone the TPU API offers the project (ListLocations, all pages), sorted."""
        from google.cloud.location import locations_pb2

        name = f"projects/{self.location.project}"
        zones: set[str] = set()
        token = ""
        with api_errors("list the zones of", name):
            while True:
                request = locations_pb2.ListLocationsRequest(name=name, page_token=token)
                response = self.client.list_locations(
                    request=request,
                    retry=self._read_retry(f"listing the zones of {name}"),
                    timeout=self.timeout,
                )
                zones.update(
                    location.location_id or location.name.rsplit("/", 1)[-1]
                    for location in response.locations
                )
                token = response.next_page_token
                if not token:
                    return sorted(zones)

    def qr_name(self, queued_resource_id: str) -> str:
        if queued_resource_id.startswith("projects/"):
            return queued_resource_id
        return self.location.queued_resource_name(queued_resource_id)

    def get_queued_resource(self, queued_resource_id: str) -> Any:
        name = self.qr_name(queued_resource_id)
        with api_errors("get", name):
            return self._calls().get_queued_resource(
                name=name, retry=self._read_retry(f"reading {name}"), timeout=self.timeout
            )

    def find_queued_resource(self, queued_resource_id: str) -> Any | None:
        """The queued resource, or None when it does not exist."""
        try:
            return self.get_queued_resource(queued_resource_id)
        except NotFoundError:
            return None

    def list_queued_resources(self) -> list[Any]:
        parent = self.location.parent
        with api_errors("list queued resources in", parent):
            pager = self._calls().list_queued_resources(
                parent=parent,
                retry=self._read_retry(f"listing queued resources in {parent}"),
                timeout=self.timeout,
            )
            return list(pager)

    def create_queued_resource(self, request: Any) -> Any:
        """Send a create; every retry carries the request's one request_id (no duplicates).
        `request`: tpuctl's rendered request (tpuctl.render.request), over REST when it
        carries fields only REST has, or a CreateQueuedResourceRequest message."""
        name = f"{request.parent}/queuedResources/{request.queued_resource_id}"
        if getattr(request, "needs_rest", False):
            fields = ", ".join(sorted(_leaves(request.rest_only)))
            client = self._rest_client(f"{name} asks for what only REST carries ({fields})")
        else:
            client = self._calls()
            if client is self.client:
                request = getattr(request, "grpc", request)
        with api_errors("create", name):
            return client.create_queued_resource(
                request=request,
                retry=self._write_retry(f"creating {name}"),
                timeout=self.timeout,
            )

    def delete_queued_resource(
        self, queued_resource_id: str, *, force: bool, request_id: str | None = None
    ) -> Any:
        from google.cloud import tpu_v2alpha1

        name = self.qr_name(queued_resource_id)
        request = tpu_v2alpha1.DeleteQueuedResourceRequest(
            name=name, force=force, request_id=request_id or ""
        )
        with api_errors("delete", name):
            return self._calls().delete_queued_resource(
                request=request,
                retry=self._write_retry(f"deleting {name}"),
                timeout=self.timeout,
            )

    def reset_queued_resource(self, queued_resource_id: str) -> Any:
        name = self.qr_name(queued_resource_id)
        with api_errors("reset", name):
            return self._calls().reset_queued_resource(
                name=name, retry=self._write_retry(f"resetting {name}"), timeout=self.timeout
            )

    def list_nodes(self) -> list[Any]:
        parent = self.location.parent
        with api_errors("list nodes in", parent):
            pager = self._calls().list_nodes(
                parent=parent,
                retry=self._read_retry(f"listing nodes in {parent}"),
                timeout=self.timeout,
            )
            return list(pager)

    def get_node(self, node_name: str) -> Any | None:
        """The node, or None when it does not exist (yet, or any more)."""
        try:
            with api_errors("get", node_name):
                return self._calls().get_node(
                    name=node_name,
                    retry=self._read_retry(f"reading {node_name}"),
                    timeout=self.timeout,
                )
        except NotFoundError:
            return None

    def get_accelerator_type(self, accelerator_type: str) -> Any | None:
        """The zone's AcceleratorType of that name (e.g. v4-16), or None when not offered."""
        name = f"{self.location.parent}/acceleratorTypes/{accelerator_type}"
        try:
            with api_errors("get", name):
                return self.client.get_accelerator_type(
                    name=name, retry=self._read_retry(f"reading {name}"), timeout=self.timeout
                )
        except NotFoundError:
            return None

    def list_accelerator_types(self) -> list[str]:
        """Every accelerator type the zone offers (ListAcceleratorTypes, all pages)."""
        parent = self.location.parent
        with api_errors("list accelerator types in", parent):
            pager = self.client.list_accelerator_types(
                request={"parent": parent, "page_size": 1000},
                retry=self._read_retry(f"listing accelerator types in {parent}"),
                timeout=self.timeout,
            )
            return [item.type_ for item in pager]

    def list_runtime_versions(self) -> list[str]:
        """Every runtime version the zone offers (ListRuntimeVersions, all pages)."""
        parent = self.location.parent
        with api_errors("list runtime versions in", parent):
            pager = self.client.list_runtime_versions(
                request={"parent": parent},
                retry=self._read_retry(f"listing runtime versions in {parent}"),
                timeout=self.timeout,
            )
            return [item.version or item.name.rsplit("/", 1)[-1] for item in pager]

    def list_reservations(self) -> list[Any]:
        """The project's TPU reservations in the zone (ListReservations, all pages)."""
        parent = self.location.parent
        with api_errors("list reservations in", parent):
            pager = self.client.list_reservations(
                request={"parent": parent},
                retry=self._read_retry(f"listing reservations in {parent}"),
                timeout=self.timeout,
            )
            return list(pager)

    def wait_operation(self, operation: Any, *, timeout: float, action: str, target: str) -> bool:
        """Wait for a long-running operation; False when it is still running at `timeout`.

        Each poll retries within the API's retry budget, saying so through `on_retry`, so an
        outage ends the wait with ApiUnavailableError instead of the client library's own
        unbounded retry (which would hang in silence for minutes).
        """
        deadline = time.monotonic() + timeout
        retry = self._read_retry(f"waiting for the {action} of {target}")
        pause = OPERATION_POLL_FIRST
        with api_errors(action, target):
            while not operation.done(retry=retry):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(pause, left))
                pause = min(pause * 2, OPERATION_POLL_MAX)
            operation.result(timeout=0)  # done: raise its error, if it ended in one
        return True


def connect(
    location: Location,
    *,
    impersonate: str | None = None,
    environ: Mapping[str, str] | None = None,
    api: str = "tpu",
) -> TpuApi:
    """A ready TpuApi for a resolved location (credentials are loaded here, once). `api`:
    the spec's tpu.api; "compute" answers through Compute Engine (tpuctl.cloud.compute);
    "either" (a NAME, a listing: where its slices are is not known) asks both
    (tpuctl.cloud.either) where Compute Engine can be reached."""
    from tpuctl.cloud.rest import ENDPOINT_ENV, RestTpuClient

    env = os.environ if environ is None else environ
    credentials = load_credentials(impersonate=impersonate, environ=env)
    if api == "compute":
        from tpuctl.cloud.compute import ComputeTpuClient

        return TpuApi(
            client=ComputeTpuClient.connect(credentials, env),
            location=location,
            retry_total=retry_seconds(env),
            impersonate=impersonate,
            api="compute",
        )
    client = make_tpu_client(impersonate=impersonate, environ=env, credentials=credentials)
    # The emulator's REST face is where `tpuctl emulator env` says; without that, none.
    reachable = not is_emulator(env) or bool(env.get(ENDPOINT_ENV))
    rest = RestTpuClient.connect(credentials, env) if reachable else None
    if api == "either" and compute_reachable(env):
        from tpuctl.cloud.compute import ComputeTpuClient
        from tpuctl.cloud.either import EitherTpuClient

        client = EitherTpuClient(client, ComputeTpuClient.connect(credentials, env))
    return TpuApi(
        client=client,
        location=location,
        retry_total=retry_seconds(env),
        impersonate=impersonate,
        rest=rest,
        transport=transport_of(env),
    )


def compute_reachable(environ: Mapping[str, str]) -> bool:
    """Compute Engine can be asked: the real one, or the emulator's where it is announced."""
    from tpuctl.cloud.compute_rest import COMPUTE_ENV

    return not is_emulator(environ) or bool(environ.get(COMPUTE_ENV))


def transport_of(environ: Mapping[str, str]) -> str:
    """TPUCTL_TPU_TRANSPORT (grpc or rest); grpc when unset."""
    chosen = environ.get(TRANSPORT_ENV, "").strip().lower() or "grpc"
    if chosen not in TRANSPORTS:
        raise UsageError(
            f"{TRANSPORT_ENV}={chosen!r} is not a transport tpuctl has",
            hint=f"set it to {' or '.join(TRANSPORTS)}, or unset it (grpc)",
        )
    return chosen


def _leaves(tree: Any, prefix: str = "") -> list[str]:
    """The dotted paths of the values in a JSON tree (`run_duration.max_run_duration`)."""
    if isinstance(tree, dict):
        return [leaf for key, value in tree.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    if isinstance(tree, list):
        return [leaf for item in tree for leaf in _leaves(item, prefix)]
    return [prefix.rstrip(".")]
