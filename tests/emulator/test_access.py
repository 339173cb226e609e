"""The emulator's access rules, as Compute Engine applies them: OS Login from the node's own
metadata, else the project's; POSIX names from emails; imported keys that expire."""

from __future__ import annotations

import time

from tpuctl.emulator.vms.access import Access, posix_username


def test_the_nodes_own_setting_wins_over_the_projects() -> None:
    access = Access()
    assert access.os_login("p", {}) is False
    access.set_project_metadata("p", {"enable-oslogin": "TRUE"})
    assert access.os_login("p", {}) is True
    assert access.os_login("p", {"enable-oslogin": "FALSE"}) is False  # the node opts out
    assert access.os_login("other", {"enable-oslogin": "true"}) is True
    access.set_project_metadata("p", {"enable-oslogin": None})  # removed
    assert access.project_metadata("p") == {} and access.os_login("p", {}) is False


def test_posix_names_follow_googles_rule() -> None:
    assert posix_username("Alice.Smith@Example.com") == "alice_smith_example_com"
    robot = posix_username("trainer@my-project.iam.gserviceaccount.com")
    assert robot.startswith("sa_") and len(robot) == 24 and robot[3:].isdigit()
    assert len(posix_username("x" * 60 + "@example.com")) == 32


def test_imported_keys_are_the_only_keys_and_they_expire() -> None:
    access = Access()
    now = int(time.time() * 1_000_000)
    profile = access.import_key("a@example.com", "ssh-ed25519 AAAAkey1 laptop", now + 60_000_000)
    access.import_key("a@example.com", "ssh-ed25519 AAAAkey2 old", now - 1)  # already expired
    access.import_key("b@example.com", "ssh-ed25519 AAAAkey3 b", 0)  # never expires
    assert profile.username == "a_example_com"
    assert access.oslogin_keys("a_example_com") == ["ssh-ed25519 AAAAkey1 laptop"]
    assert access.oslogin_keys("b_example_com") == ["ssh-ed25519 AAAAkey3 b"]
    assert access.oslogin_keys("nobody") == []
    fingerprint = next(iter(access.profile("a@example.com").keys))
    assert access.delete_key("a@example.com", fingerprint)
    assert len(access.profile("a@example.com").keys) == 1
