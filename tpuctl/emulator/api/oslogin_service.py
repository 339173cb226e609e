"""The OS Login API (`google.cloud.oslogin.v1.OsLoginService`) on the emulator's gRPC port, for
the unmodified google-cloud-os-login client: import a key for an account (with its expiry),
read the login profile (the POSIX user), delete a key. Accounts and keys live in
tpuctl.emulator.vms.access, which the workers' SSH servers consult."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from tpuctl.emulator.api.service import unary_handler
from tpuctl.emulator.control.status import invalid
from tpuctl.emulator.vms.access import Access, Profile

OS_LOGIN_SERVICE = "google.cloud.oslogin.v1.OsLoginService"


def _email(parent: str) -> str:
    """`users/{email}` (or a key's name under it) → the email."""
    if not parent.startswith("users/"):
        raise invalid(f"expected users/{{email}}, got {parent!r}")
    email = parent.removeprefix("users/").split("/", 1)[0]
    if "@" not in email:
        raise invalid(f"{email!r} is not an account's email")
    return email


def _profile(profile: Profile) -> Any:
    from google.cloud import oslogin_v1
    from google.cloud.oslogin_v1 import common

    uid = 1000 + int.from_bytes(profile.username.encode()[:3].ljust(3, b"\0"), "big") % 60000
    return oslogin_v1.LoginProfile(
        name=profile.email,
        posix_accounts=[
            common.PosixAccount(
                primary=True,
                username=profile.username,
                uid=uid,
                gid=uid,
                home_directory=f"/home/{profile.username}",
                shell="/bin/bash",
                account_id=profile.email,
                name=f"users/{profile.email}/projects/-",
                operating_system_type=common.OperatingSystemType.LINUX,
            )
        ],
        ssh_public_keys={
            fingerprint: common.SshPublicKey(
                key=item.key,
                expiration_time_usec=item.expires_usec,
                fingerprint=fingerprint,
                name=f"users/{profile.email}/sshPublicKeys/{fingerprint}",
            )
            for fingerprint, item in profile.keys.items()
        },
    )


class OsLoginServicer:
    def __init__(self, access: Access, check: Callable[[str, Any], None]) -> None:
        self._access = access
        self._check = check  # the API fault injector, as for the TPU API

    def handler(self) -> grpc.GenericRpcHandler:
        from google.cloud import oslogin_v1
        from google.protobuf import empty_pb2

        access = self._access

        def import_key(request: Any) -> Any:
            email = _email(request.parent)
            key = request.ssh_public_key.key.strip()
            if len(key.split()) < 2:
                raise invalid("ssh_public_key.key must be 'TYPE BASE64 [comment]'")
            profile = access.import_key(
                email, key, int(request.ssh_public_key.expiration_time_usec)
            )
            return oslogin_v1.ImportSshPublicKeyResponse(login_profile=_profile(profile))

        def get_profile(request: Any) -> Any:
            return _profile(access.profile(_email(request.name)))

        def delete_key(request: Any) -> Any:
            access.delete_key(_email(request.name), request.name.rsplit("/", 1)[-1])
            return empty_pb2.Empty()

        methods: dict[str, tuple[Any, Callable[[Any], Any], Callable[[Any], bytes]]] = {
            "ImportSshPublicKey": (
                oslogin_v1.ImportSshPublicKeyRequest,
                import_key,
                oslogin_v1.ImportSshPublicKeyResponse.serialize,
            ),
            "GetLoginProfile": (
                oslogin_v1.GetLoginProfileRequest,
                get_profile,
                oslogin_v1.LoginProfile.serialize,
            ),
            "DeleteSshPublicKey": (
                oslogin_v1.DeleteSshPublicKeyRequest,
                delete_key,
                lambda message: message.SerializeToString(),
            ),
        }
        handlers = {
            method: self._unary(method, request_type.deserialize, fn, serialize)
            for method, (request_type, fn, serialize) in methods.items()
        }
        return grpc.method_handlers_generic_handler(OS_LOGIN_SERVICE, handlers)

    def _unary(
        self,
        method: str,
        deserialize: Callable[[bytes], Any],
        fn: Callable[[Any], Any],
        serialize: Callable[[Any], bytes],
    ) -> grpc.RpcMethodHandler:
        return unary_handler(method, self._check, deserialize, fn, serialize)
