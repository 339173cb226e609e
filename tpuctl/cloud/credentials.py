"""Credentials for Google's APIs: Application Default Credentials or an impersonated service
account, none on the emulator, and the TPU API client made with them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuctl.cloud.resolve import EMULATOR_ENV, gcloud_config_dir, is_emulator
from tpuctl.errors import AuthError
from tpuctl.spec.model import CLOUD_PLATFORM_SCOPE


def load_credentials(
    *, impersonate: str | None = None, environ: Mapping[str, str] | None = None
) -> Any:
    """Anonymous credentials for the emulator, else ADC (optionally impersonating an account)."""
    env = os.environ if environ is None else environ
    if is_emulator(env):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    import google.auth
    from google.auth import exceptions as auth_exceptions

    try:
        credentials, _project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except auth_exceptions.DefaultCredentialsError as error:
        explicit = env.get("GOOGLE_APPLICATION_CREDENTIALS")
        if explicit:  # google-auth reads it first, and stops there when it is unusable
            raise AuthError(
                "no usable Google Cloud credentials: GOOGLE_APPLICATION_CREDENTIALS "
                f"({explicit}: unusable, {_credentials_file_problem(explicit, error)}), and "
                "google-auth looks nowhere else while it is set; "
                f"{EMULATOR_ENV} is unset so the emulator is not in use",
                hint="point it at a service-account key or ADC file, or unset it to use "
                "gcloud's ADC ('gcloud auth application-default login')",
                cause=str(error),
            ) from None
        message = _no_credentials_message(env, error)
        raise AuthError(message, hint=_login_hint(), cause=str(error)) from None
    if impersonate:
        from google.auth import impersonated_credentials

        credentials = impersonated_credentials.Credentials(  # type: ignore[no-untyped-call]
            source_credentials=credentials,
            target_principal=impersonate,
            target_scopes=[CLOUD_PLATFORM_SCOPE],
            lifetime=3600,
        )
    return credentials


def default_project(environ: Mapping[str, str] | None = None) -> str | None:
    """google-auth's idea of the project (ADC file, GCE metadata); None when it has none."""
    env = os.environ if environ is None else environ
    if is_emulator(env):
        return None
    import google.auth
    from google.auth import exceptions as auth_exceptions

    try:
        _credentials, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except auth_exceptions.DefaultCredentialsError:
        return None
    return str(project) if project else None


def _no_credentials_message(env: Mapping[str, str], error: Exception) -> str:
    adc_file = gcloud_config_dir(env) / "application_default_credentials.json"
    adc_note = (
        f"present but unusable: {_credentials_file_problem(str(adc_file), error)}"
        if adc_file.exists()
        else "missing"
    )
    return (
        "no Google Cloud credentials: looked at GOOGLE_APPLICATION_CREDENTIALS (unset), "
        f"gcloud's ADC file {adc_file} ({adc_note}) and the GCE metadata server (not "
        f"reachable); {EMULATOR_ENV} is unset so the emulator is not in use"
    )


# The "type" of the credential files google-auth loads (google.auth._default).
CREDENTIAL_FILE_TYPES = (
    "service_account",
    "authorized_user",
    "external_account",
    "external_account_authorized_user",
    "impersonated_service_account",
    "gdch_service_account",
)


def _credentials_file_problem(path: str, error: Exception) -> str:
    """Why google-auth could not use the credentials file at `path`, in a few words."""
    import json

    file = Path(path).expanduser()
    if not file.exists():
        return "no such file"
    if file.is_dir():
        return "a directory, not a key file"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as problem:
        return problem.strerror or str(problem)
    except ValueError:
        return "not JSON"
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in CREDENTIAL_FILE_TYPES:
        return f"type {kind!r} is not one google-auth loads ({', '.join(CREDENTIAL_FILE_TYPES)})"
    return " ".join(str(error).replace(str(path), "it").split())


def _login_hint() -> str:
    return (
        "run 'gcloud auth application-default login', or set GOOGLE_APPLICATION_CREDENTIALS "
        "to a service-account key file"
    )


def make_tpu_client(
    *,
    impersonate: str | None = None,
    environ: Mapping[str, str] | None = None,
    credentials: Any = None,
) -> Any:
    """A v2alpha1 TpuClient: insecure gRPC to TPU_EMULATOR_HOST, else the real endpoint."""
    env = os.environ if environ is None else environ
    if credentials is None:
        credentials = load_credentials(impersonate=impersonate, environ=env)
    from google.cloud import tpu_v2alpha1

    host = env.get(EMULATOR_ENV)
    if host:
        import grpc
        from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport

        channel = grpc.insecure_channel(host)
        transport = TpuGrpcTransport(channel=channel, credentials=None)
        return tpu_v2alpha1.TpuClient(transport=transport)
    return tpu_v2alpha1.TpuClient(credentials=credentials)
