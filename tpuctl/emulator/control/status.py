"""API errors with real gRPC status codes, raised by the state machine and sent by the servers."""

from __future__ import annotations

import grpc
from google.rpc import status_pb2


class ApiError(Exception):
    """An RPC failure: a gRPC status code and a message in the style of the service."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_status(self) -> status_pb2.Status:
        return status_pb2.Status(code=self.code.value[0], message=self.message)


def not_found(kind: str, name: str) -> ApiError:
    return ApiError(grpc.StatusCode.NOT_FOUND, f'Resource "{name}" ({kind}) was not found')


def invalid(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, message)


def precondition(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.FAILED_PRECONDITION, message)


def already_exists(kind: str, name: str) -> ApiError:
    return ApiError(grpc.StatusCode.ALREADY_EXISTS, f'Resource "{name}" ({kind}) already exists')


def code_by_name(name: str) -> grpc.StatusCode:
    """`"UNAVAILABLE"` → grpc.StatusCode.UNAVAILABLE; ValueError when unknown."""
    try:
        code = grpc.StatusCode[name.strip().upper()]
    except KeyError:
        known = ", ".join(code.name for code in grpc.StatusCode if code != grpc.StatusCode.OK)
        raise ValueError(f"unknown gRPC status code {name!r}; known: {known}") from None
    if code == grpc.StatusCode.OK:
        raise ValueError("OK is not an error code")
    return code
