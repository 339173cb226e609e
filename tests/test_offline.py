"""The suite never reaches beyond this machine: google-auth with no credentials would probe
the GCE metadata server at its link-local address (169.254.169.254)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK_LOCAL = "169.254."


def test_every_test_runs_with_the_metadata_server_off(tmp_path: Path) -> None:
    assert os.environ["NO_GCE_CHECK"] == "true"
    for name in ("GCE_METADATA_HOST", "GCE_METADATA_IP"):
        assert os.environ[name].startswith("127.0.0.1:"), name


def test_google_auth_without_credentials_contacts_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import google.auth
    from google.auth import exceptions

    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud credentials
    monkeypatch.setenv("HOME", str(tmp_path))
    contacted: list[Any] = []
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        contacted.append(address)
        if str(address[0]).startswith(LINK_LOCAL):
            raise AssertionError(f"contacted the metadata server at {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    with pytest.raises(exceptions.DefaultCredentialsError):
        google.auth.default()
    assert not [a for a in contacted if str(a[0]).startswith(LINK_LOCAL)]


@pytest.mark.parametrize("script", ["scripts/test", "scripts/demo"])
def test_the_scripts_keep_google_auth_off_the_metadata_server(script: str) -> None:
    assert "export NO_GCE_CHECK=true" in (REPO / script).read_text()
