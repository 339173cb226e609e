"""YAML text → plain data with a source position per path: duplicates, merges, ${VAR}, guards."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from tpuctl.errors import SourceLocation, SpecError, quoted

# libyaml composes recursively in C and overflows the stack (a segfault, not an exception) on
# tens of thousands of nested collections. Past this many nesting characters the pure-Python
# composer is used instead: it raises RecursionError, which becomes a SpecError.
_C_NESTING_BUDGET = 5000
# A spec is a small YAML file; reading stops here, so /dev/zero or `yes |` cannot fill memory.
MAX_SPEC_CHARS = 1 << 20
# Aliases can expand a small file into a huge tree ("billion laughs").
_MAX_NODES = 50_000
_MAX_DEPTH = 32

_MERGE_TAG = "tag:yaml.org,2002:merge"
_PLAIN_COLLECTION_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
_VARIABLE = re.compile(r"\$\$\{|\$\{(?P<body>[^}\n]*)(?P<close>\})?")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)

_INT_TAG = "tag:yaml.org,2002:int"
# YAML 1.1 reads 010 as 8, 0x10 as 16, 0b10 as 2 and 1:30 as 90: a spec's integers are
# decimal, anything else stays the string it was written as (and an integer field says so).
_DECIMAL_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$")
_OTHER_BASE_INT = re.compile(
    r"[-+]?(?P<digits>0[0-9_]+|0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+"
    r"|[1-9][0-9_]*(?::[0-5]?[0-9])+)",
    re.ASCII,
)

L = TypeVar("L", bound=type[Resolver])


def _decimal_integers(loader: L) -> L:
    """A subclass of `loader` whose implicit integers are decimal only."""
    resolvers = {
        first: [(tag, pattern) for tag, pattern in entries if tag != _INT_TAG]
        for first, entries in loader.yaml_implicit_resolvers.items()
    }
    subclass = cast(
        L, type(f"Decimal{loader.__name__}", (loader,), {"yaml_implicit_resolvers": resolvers})
    )
    subclass.add_implicit_resolver(_INT_TAG, _DECIMAL_INT, list("-+0123456789"))
    return subclass


try:  # libyaml is much faster; PyYAML wheels ship it but a source build may not.
    from yaml import CSafeLoader as _CLoader
except ImportError:  # pragma: no cover - depends on the PyYAML build
    from yaml import SafeLoader as _CLoader  # type: ignore[assignment]
_FastLoader = _decimal_integers(_CLoader)
_PythonLoader = _decimal_integers(yaml.SafeLoader)
_SpecResolver = _decimal_integers(Resolver)


def other_base_integer(text: str) -> int | None:
    """What a YAML reader may make of an integer written in another base than 10 (010 → 8,
    0o10 → 8, 0x10 → 16, 0b10 → 2, 1:30 → 90); None when `text` is no such integer."""
    match = _OTHER_BASE_INT.fullmatch(text.strip())
    if match is None:
        return None
    digits = match["digits"].replace("_", "")
    if ":" in digits:
        value = 0
        for part in digits.split(":"):
            value = value * 60 + int(part)
    elif digits[1:2].isdigit():
        value = int(digits, 8) if digits.isdigit() and max(digits) < "8" else int(digits)
    else:
        value = int(digits, 0)
    return -value if text.strip().startswith("-") else value


@dataclass
class Document:
    """Plain data (dicts, lists, scalars) and where each dotted path came from."""

    data: Any
    source: str
    values: dict[str, SourceLocation] = field(default_factory=dict)  # path → value position
    keys: dict[str, SourceLocation] = field(default_factory=dict)  # path → its key's position

    def value_location(self, path: str) -> SourceLocation:
        """The position of the value at `path`, else of its nearest ancestor, else the file."""
        while True:
            if path in self.values:
                return self.values[path]
            if path in self.keys:
                return self.keys[path]
            if not path:
                return SourceLocation(self.source)
            path = parent_path(path)

    def key_location(self, path: str) -> SourceLocation:
        return self.keys.get(path) or self.value_location(path)


def parent_path(path: str) -> str:
    """`a.b[0].c` → `a.b[0]` → `a.b` → `a` → ``."""
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def join_path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def expand_variables(
    text: str, environ: Mapping[str, str], *, location: SourceLocation, path: str | None
) -> str:
    """`${VAR}` → its value from `environ`; `$${` → a literal `${`; `$VAR` is left alone."""
    if "${" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match["body"]
        if match["close"] is None or not _VARIABLE_NAME.fullmatch(name):
            raise SpecError(
                f"invalid variable reference {quoted(match.group(0))}",
                location=location,
                path=path,
                hint="write ${NAME} with a variable name, or $${ for a literal ${",
            )
        if name not in environ:
            raise SpecError(
                f"environment variable {name} is not set",
                location=location,
                path=path,
                hint=f"export {name}, or write $${{{name}}} for a literal ${{{name}}}",
            )
        return environ[name]

    return _VARIABLE.sub(replace, text)


def compose_document(text: str, source: str, environ: Mapping[str, str]) -> Document | None:
    """Parse one YAML document; None when it is empty. Every problem is a SpecError."""
    if len(text) > MAX_SPEC_CHARS:
        raise spec_too_large(source)
    loader = _FastLoader if _nesting(text) < _C_NESTING_BUDGET else _PythonLoader
    try:
        root = yaml.compose(text, Loader=loader)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, source) from None
    except yaml.YAMLError as exc:
        raise SpecError(
            f"invalid YAML: {_one_line(str(exc))}", location=SourceLocation(source)
        ) from None
    except RecursionError:
        raise SpecError(
            "invalid YAML: nested too deeply", location=SourceLocation(source)
        ) from None
    if root is None:
        return None
    document = Document(data=None, source=source)
    walker = _Walker(document, environ)
    document.data = walker.walk(root, "", 0)
    return document


def spec_too_large(source: str) -> SpecError:
    """The one error for a spec past MAX_SPEC_CHARS (its real size is never known: reading
    stops at the limit)."""
    return SpecError(
        f"spec is too large: more than {MAX_SPEC_CHARS >> 20} MiB ({MAX_SPEC_CHARS} characters), "
        "the limit for a spec",
        location=SourceLocation(source),
        hint="a spec is a small YAML file; check that this is the spec you meant",
    )


def load_value(text: str, *, location: SourceLocation, path: str) -> Any:
    """A `--set` value, typed as YAML types it (`2` → int, `[a, b]` → list), keys as strings."""
    loader = _FastLoader if _nesting(text) < _C_NESTING_BUDGET else _PythonLoader
    try:
        return _string_keys(yaml.load(text, Loader=loader))
    except yaml.YAMLError as exc:
        problem = _one_line(str(exc))
    except RecursionError:
        problem = "nested too deeply"
    raise SpecError(
        f"override value is not valid YAML: {problem}",
        location=location,
        path=path,
        hint="quote the value",
    )


def _string_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _string_keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_string_keys(item) for item in value]
    return value


def _nesting(text: str) -> int:
    return sum(text.count(char) for char in "[{-?")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _yaml_error(exc: yaml.MarkedYAMLError, source: str) -> SpecError:
    mark = exc.problem_mark or exc.context_mark
    location = (
        SourceLocation(source, mark.line + 1, mark.column + 1) if mark else SourceLocation(source)
    )
    problem = _one_line(exc.problem or "syntax error")
    if exc.context:
        problem = f"{problem} ({_one_line(exc.context)})"
    hint = "check the indentation, and quote values that contain ': ', '#' or start with '{', '['"
    if "tab" in problem.lower():
        hint = "indent with spaces; YAML does not allow tabs"
    return SpecError(f"invalid YAML: {problem}", location=location, hint=hint)


class _Walker:
    """Turns composed nodes into plain data, recording a position for every path."""

    def __init__(self, document: Document, environ: Mapping[str, str]) -> None:
        self.document = document
        self.environ = environ
        self.constructor = SafeConstructor()
        self.resolver = _SpecResolver()
        self.nodes = 0
        self.active: set[int] = set()

    def location(self, node: yaml.Node) -> SourceLocation:
        mark = node.start_mark
        return SourceLocation(self.document.source, mark.line + 1, mark.column + 1)

    def walk(self, node: yaml.Node, path: str, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise SpecError(
                f"spec has more than {_MAX_NODES} values (runaway YAML aliases?)",
                location=self.location(node),
                path=path or None,
            )
        if depth > _MAX_DEPTH:
            raise SpecError(
                f"nested more than {_MAX_DEPTH} levels deep",
                location=self.location(node),
                path=path or None,
            )
        self.document.values[path] = self.location(node)
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path)
        if node.tag not in _PLAIN_COLLECTION_TAGS:
            raise self.tag_error(node, path)
        if id(node) in self.active:
            raise SpecError(
                "a YAML alias refers to its own parent (recursive structure)",
                location=self.location(node),
                path=path or None,
            )
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [
                    self.walk(item, f"{path}[{index}]", depth + 1)
                    for index, item in enumerate(node.value)
                ]
            assert isinstance(node, yaml.MappingNode)
            return self.mapping(node, path, depth)
        finally:
            self.active.discard(id(node))

    def tag_error(self, node: yaml.Node, path: str) -> SpecError:
        return SpecError(
            f"unsupported YAML tag {quoted(node.tag)}",
            location=self.location(node),
            path=path or None,
            hint="remove the tag; a spec holds plain mappings, lists, strings, numbers, booleans",
        )

    def scalar(self, node: yaml.ScalarNode, path: str) -> Any:
        if "${" in node.value and node.tag == "tag:yaml.org,2002:str":
            value = expand_variables(
                node.value, self.environ, location=self.location(node), path=path or None
            )
            if node.style in (None, ""):
                # An unquoted `slices: ${N}` types its expansion as YAML would have typed it.
                tag = self.resolver.resolve(  # type: ignore[no-untyped-call]
                    yaml.ScalarNode, value, (True, False)
                )
            else:
                tag = node.tag
            node = yaml.ScalarNode(tag, value, node.start_mark, node.end_mark, node.style)
        if node.tag not in SafeConstructor.yaml_constructors:
            raise self.tag_error(node, path)
        try:
            return self.constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            raise SpecError(
                f"cannot read value {quoted(node.value)}: {_one_line(str(exc))}",
                location=self.location(node),
                path=path or None,
                hint="quote it to make it a string",
            ) from None

    def mapping(self, node: yaml.MappingNode, path: str, depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        lines: dict[str, int | None] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                self.merge(value_node, path, depth, merged)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(
                    "mapping keys must be plain strings",
                    location=self.location(key_node),
                    path=path or None,
                )
            key = key_node.value
            child = join_path(path, key)
            if key in result:
                raise SpecError(
                    f"duplicate key {quoted(key)} (first at line {lines[key]})",
                    location=self.location(key_node),
                    path=child,
                    hint="remove one of them; YAML would silently keep only the last",
                )
            self.document.keys[child] = self.location(key_node)
            lines[key] = self.document.keys[child].line
            result[key] = self.walk(value_node, child, depth + 1)
        # Explicit keys win over `<<: *anchor` keys, as in YAML's merge-key spec.
        return {**merged, **result} if merged else result

    def merge(self, node: yaml.Node, path: str, depth: int, merged: dict[str, Any]) -> None:
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        own_location = self.document.values[path]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                raise SpecError(
                    "`<<` must merge a mapping or a list of mappings",
                    location=self.location(source),
                    path=path or None,
                )
            # walk() guards recursion and size; the merged mapping is not this path's position.
            data = self.walk(source, path, depth + 1)
            self.document.values[path] = own_location
            for key, value in data.items():
                merged.setdefault(key, value)
