"""Credentials: anonymous for the emulator, ADC otherwise, impersonation on top (all offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tpuctl.cloud.credentials import load_credentials, make_tpu_client


def service_account_key(tmp_path: Path) -> Path:
    """A syntactically real service-account key file (never used against a server)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path = tmp_path / "key.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "key-project",
                "private_key_id": "0",
                "private_key": pem,
                "client_email": "ci@key-project.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": "http://127.0.0.1:9/token",
            }
        )
    )
    return path


def test_emulator_means_anonymous_credentials_and_an_insecure_channel() -> None:
    from google.auth.credentials import AnonymousCredentials

    env = {"TPU_EMULATOR_HOST": "127.0.0.1:1"}
    assert isinstance(load_credentials(environ=env), AnonymousCredentials)
    client = make_tpu_client(environ=env)
    assert type(client.transport).__name__ == "TpuGrpcTransport"


def test_adc_key_file_and_impersonation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from google.auth import impersonated_credentials
    from google.oauth2 import service_account

    # google.auth.default reads the process environment itself.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(service_account_key(tmp_path)))
    monkeypatch.delenv("TPU_EMULATOR_HOST", raising=False)
    env: dict[str, str] = {}
    plain = load_credentials(environ=env)
    assert isinstance(plain, service_account.Credentials)
    target = "runner@other-project.iam.gserviceaccount.com"
    acting = load_credentials(impersonate=target, environ=env)
    assert isinstance(acting, impersonated_credentials.Credentials)
    assert acting.service_account_email == target


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ('{"type": "mystery"}', "type 'mystery'"),
    ],
)
def test_an_unusable_credentials_file_says_why_in_the_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, why: str
) -> None:
    """The message a table shows (not only the JSON error's `cause`) says what is wrong with
    the file GOOGLE_APPLICATION_CREDENTIALS names."""
    from tpuctl.errors import AuthError

    key = tmp_path / "key.json"
    if content is not None:
        key.write_text(content, encoding="utf-8")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    with pytest.raises(AuthError) as raised:
        load_credentials(environ={"GOOGLE_APPLICATION_CREDENTIALS": str(key)})
    line = raised.value.one_line()
    assert f"GOOGLE_APPLICATION_CREDENTIALS ({key}: unusable, {why}" in line, line
