"""The vocabulary of the spec's field table (tpuctl.spec.fields): a `Field` (a key's kind,
constraints, default and documenting sentence) and the patterns the table's names follow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# str: a string · int: an integer (never a bool) · bool · duration: "90s", "1h30m" or seconds
# time_bound: a duration or an RFC 3339 time · str_list: list of strings
# commands: one string or a list of strings (each a command) · command: one shell line, or a
# list of strings (an argv) · str_map: mapping of strings (numbers are
# stringified, bools are refused) · section: a nested mapping described by `children` ·
# sections: a list of such mappings
Kind = Literal[
    "str",
    "int",
    "bool",
    "duration",
    "time_bound",
    "str_list",
    "commands",
    "command",
    "str_map",
    "section",
    "sections",
]

# GCE resource names (node ids, network tags): lowercase, start with a letter, no trailing dash.
GCE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Node ids are `<name>-<i>` with i < 256, so the name keeps room for the suffix under 63.
MAX_NAME_LENGTH = 40
LABEL_KEY_PATTERN = r"^[a-z][a-z0-9_-]{0,62}$"
LABEL_VALUE_PATTERN = r"^[a-z0-9_-]{0,63}$"
MAX_LABELS = 64
POSIX_USER_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
TOPOLOGY_PATTERN = r"^[0-9]+x[0-9]+(x[0-9]+)?$"
# Google Cloud project ids: 6 to 30 characters, lowercase letters, digits and hyphens, starting
# with a letter, not ending with a hyphen; older projects may carry a domain (example.com:id).
_PROJECT_ID = r"[a-z][-a-z0-9]{4,28}[a-z0-9]"
_DOMAIN = r"(?:[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}"
PROJECT_PATTERN = rf"^(?:{_DOMAIN}:)?{_PROJECT_ID}$"
PROJECT_RULE = (
    "a project id: 6 to 30 lowercase letters, digits and hyphens, starting with a letter, "
    "not ending with a hyphen, e.g. my-project; or the legacy form example.com:my-project"
)
# Compute zones: <region>-<letter>, the region a continent, a direction and a number.
ZONE_PATTERN = r"^[a-z]+-[a-z]+[0-9]+-[a-z]$"
ZONE_RULE = "a zone name such as us-central2-b or europe-west4-a: a region, a hyphen, a letter"
KMS_KEY_PATTERN = r"^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$"
DISK_PATTERN = r"^([a-z]([-a-z0-9]*[a-z0-9])?|projects/[^/]+/zones/[^/]+/disks/[^/]+)$"
RESERVATION_PATTERN = r"^([A-Za-z0-9-]+|projects/[^/]+/locations/[^/]+/reservations/[^/]+)$"
RESERVATION_RULE = "a reservation name, or projects/P/locations/ZONE/reservations/NAME"


@dataclass(frozen=True)
class Field:
    """One key of the spec: its type, constraints, default and the sentence that documents it."""

    name: str
    kind: Kind
    doc: str
    default: Any = None  # JSON-able documented default; None means "unset"
    default_doc: str | None = None  # when the default is computed ("the spec's name")
    required: bool = False
    enum: tuple[str, ...] = ()
    pattern: str | None = None  # str values / str_list items
    rule: str | None = None  # the pattern in words, for messages
    max_length: int | None = None
    minimum: int | None = None
    maximum: int | None = None
    key_pattern: str | None = None  # str_map keys
    key_rule: str | None = None  # the key_pattern in words, for messages
    value_pattern: str | None = None  # str_map values
    value_rule: str | None = None
    max_items: int | None = None  # str_map entries
    forbidden_keys: tuple[str, ...] = ()  # str_map keys owned by tpuctl
    forbidden_hint: str | None = None
    example: Any = None
    children: tuple[Field, ...] = ()
    # Sections with alternative forms: exactly one group of keys must be given, complete.
    one_of: tuple[tuple[str, ...], ...] = ()

    def child(self, name: str) -> Field | None:
        for field in self.children:
            if field.name == name:
                return field
        return None
