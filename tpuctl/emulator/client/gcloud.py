"""The settings that point the real gcloud at an emulator: its Cloud TPU REST API, the Compute
Engine REST stub, no credentials (gcloud's properties as CLOUDSDK_* environment variables)."""

from __future__ import annotations

REST_EXPORT = "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"


def gcloud_settings(rest_endpoint: str, compute_endpoint: str, project: str = "") -> dict[str, str]:
    """`api_endpoint_overrides/tpu` and `/compute` (of Compute Engine the emulator serves a
    project's metadata), `auth/disable_credentials`, and `core/project` when given."""
    settings = {
        REST_EXPORT: rest_endpoint,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": compute_endpoint.rstrip("/") + "/",
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
    }
    if project:
        settings["CLOUDSDK_CORE_PROJECT"] = project
    return settings
