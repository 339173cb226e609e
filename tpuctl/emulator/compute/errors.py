"""Compute Engine's errors: an HTTP status, a reason and a message, sent in Google's JSON error
format (`{"error": {"code", "message", "errors": [{"message", "domain", "reason"}], "status"}}`),
and the errors a long-running operation ends with (`error.errors[].code`)."""

from __future__ import annotations

from typing import Any

# HTTP status → the canonical status name the JSON error carries.
_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
_HTTP_MESSAGES = {
    400: "BAD REQUEST",
    403: "FORBIDDEN",
    404: "NOT FOUND",
    409: "CONFLICT",
    412: "PRECONDITION FAILED",
    500: "INTERNAL SERVER ERROR",
    503: "SERVICE UNAVAILABLE",
}


class ComputeApiError(Exception):
    """A request the fake refuses, as Compute Engine refuses it."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.status,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
                "status": _STATUS.get(self.status, "UNKNOWN"),
            }
        }


def _path(link: str) -> str:
    """`projects/P/zones/Z/instances/N`: how Compute Engine's messages name a resource."""
    return link.split("/compute/v1/", 1)[-1]


def not_found(link: str) -> ComputeApiError:
    return ComputeApiError(404, "notFound", f"The resource '{_path(link)}' was not found")


def already_exists(link: str) -> ComputeApiError:
    return ComputeApiError(409, "alreadyExists", f"The resource '{_path(link)}' already exists")


def invalid(message: str, reason: str = "invalid") -> ComputeApiError:
    return ComputeApiError(400, reason, message)


def bad_field(field: str, value: Any, why: str) -> ComputeApiError:
    return invalid(f"Invalid value for field '{field}': '{value}'. {why}")


def not_ready(link: str) -> ComputeApiError:
    return ComputeApiError(400, "resourceNotReady", f"The resource '{_path(link)}' is not ready")


def in_use(link: str, user: str) -> ComputeApiError:
    return ComputeApiError(
        400,
        "resourceInUseByAnotherResource",
        f"The {_kind(link)} resource '{_path(link)}' is already being used by '{_path(user)}'",
    )


def fingerprint_mismatch() -> ComputeApiError:
    return ComputeApiError(
        412,
        "conditionNotMet",
        "Supplied fingerprint does not match current metadata fingerprint.",
    )


def _kind(link: str) -> str:
    parts = link.rstrip("/").split("/")
    return parts[-2].rstrip("s") if len(parts) >= 2 else "resource"


class OperationError:
    """How an operation failed: its `error.errors` entries and HTTP status."""

    def __init__(self, code: str, message: str, http_status: int) -> None:
        self.code = code
        self.message = message
        self.http_status = http_status

    def fields(self) -> dict[str, Any]:
        return {
            "error": {"errors": [{"code": self.code, "message": self.message}]},
            "httpErrorStatusCode": self.http_status,
            "httpErrorMessage": _HTTP_MESSAGES.get(self.http_status, "ERROR"),
        }


def stockout(zone_link: str) -> OperationError:
    """No capacity in the zone: what an insert (or start) of a VM that cannot get its TPUs ends
    with. Compute Engine's wording, the code clients match on."""
    return OperationError(
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        f"The zone '{_path(zone_link)}' does not have enough resources available to fulfill the "
        "request.  Try a different zone, or try again later.",
        503,
    )


def interrupted(link: str) -> OperationError:
    """An insert or start overtaken by a delete, a stop or a preemption before the VM ran (the
    service's own code for this is not documented: this one is the fake's)."""
    return OperationError(
        "ABORTED",
        f"The resource '{_path(link)}' was deleted or stopped before the operation completed.",
        409,
    )
