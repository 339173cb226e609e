"""Cloud TPU's queued resources and Compute Engine's TPU slices behind one TpuClient face, for
what names a slice without saying where it is (a NAME, `list`, `gc`, `runs --live`): a list
holds both, and a call about one name goes to the Cloud TPU API, then, when that has no such
name, to Compute Engine.

A Compute Engine side that cannot be listed (no permission, no endpoint) never hides the
Cloud TPU side: its error is told through `on_error` and the list is Cloud TPU's alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The calls answered for one name: Cloud TPU first, Compute Engine when it has none.
BY_NAME = frozenset(
    {
        "get_queued_resource",
        "delete_queued_resource",
        "reset_queued_resource",
        "get_node",
        "get_guest_attributes",
        "update_node",
    }
)
LISTS = frozenset({"list_queued_resources", "list_nodes"})


class EitherTpuClient:
    """See the module doc. `tpu`: google-cloud-tpu's TpuClient (or its REST face); `compute`:
    tpuctl.cloud.compute.ComputeTpuClient. Every other call (locations, accelerator types,
    maintenance simulation) is the Cloud TPU API's."""

    def __init__(
        self, tpu: Any, compute: Any, on_error: Callable[[str], None] | None = None
    ) -> None:
        self.tpu = tpu
        self.compute = compute
        self.on_error = on_error

    def __getattr__(self, name: str) -> Any:
        if name in BY_NAME:
            return self._by_name(name)
        if name in LISTS:
            return self._both(name)
        return getattr(self.tpu, name)

    def _by_name(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            from google.api_core import exceptions

            try:
                return getattr(self.tpu, method)(*args, **kwargs)
            except exceptions.NotFound as missing:
                try:
                    return getattr(self.compute, method)(*args, **kwargs)
                except (exceptions.Forbidden, exceptions.Unauthenticated):
                    # Compute Engine not open to this caller: the name is not Cloud TPU's,
                    # which is what can be said.
                    raise missing from None

        return call

    def _both(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> list[Any]:
            from google.api_core import exceptions

            found = list(getattr(self.tpu, method)(*args, **kwargs))
            try:
                found += list(getattr(self.compute, method)(*args, **kwargs))
            except (exceptions.GoogleAPICallError, exceptions.RetryError) as error:
                if self.on_error is not None:
                    self.on_error(f"Compute Engine's TPU VMs not listed: {error}")
            return found

        return call
