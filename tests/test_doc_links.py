"""The README and the pages under docs/ hold together: every relative link reaches a file (and
its `#anchor` a heading there, by GitHub's rules), every page is reachable from the README,
every repository path they name exists, and the README stays a first read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 350
# Paths in `code` that start with one of these name a file or directory of the repository.
REPOSITORY_ROOTS = ("configs/", "docs/", "scripts/", "tests/", "tpuctl/")

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXAMPLE_SPEC = re.compile(r"(?<![\w/.-])configs/[\w.-]+\.ya?ml\b")  # not MaxText/configs/…
_NOT_A_PATH = re.compile(r"[<>*{}$]|^tpuctl/v\d+$")  # placeholders; the spec's apiVersion


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (no Markdown), lower case, without punctuation
    or symbols, spaces as hyphens."""
    text = _CODE_SPAN.sub(lambda match: match.group(2), heading)
    text = _LINK.sub(lambda match: match.group(1), text)
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(c for c in text if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2, … for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """Every link target in the page's prose (code spans and code blocks are not links)."""
    prose = "\n".join(prose_lines(page.read_text(encoding="utf-8")))
    prose = _CODE_SPAN.sub("code", prose)
    return [match.group(2) for match in _LINK.finditer(prose)]


def code_spans(page: Path) -> list[str]:
    prose = "\n".join(prose_lines(page.read_text(encoding="utf-8")))
    return [match.group(2).strip() for match in _CODE_SPAN.finditer(prose)]


def is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target) is not None


def resolve(page: Path, target: str) -> tuple[Path, str]:
    """The file a relative link points at, and its anchor ('' for none)."""
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Preflight: `tpuctl doctor`") == "preflight-tpuctl-doctor"
    assert slug("The job's environment") == "the-jobs-environment"
    assert slug("tpuctl ps --job") == "tpuctl-ps---job"
    assert slug("Project, zone and credentials") == "project-zone-and-credentials"
    assert slug("[Faults](x.md) and `api_fault`") == "faults-and-api_fault"


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_relative_link_reaches_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        if is_external(target):
            continue
        path, anchor = resolve(page, target)
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif REPO not in path.parents and path != REPO:
            broken.append(f"{target}: outside the repository")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {name(path)}")
    assert broken == [], f"{name(page)} has broken links: {broken}"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target in links(page):
            if is_external(target):
                continue
            path, _ = resolve(page, target)
            if path.suffix == ".md" and path.exists() and path not in reached:
                reached.add(path)
                todo.append(path)
    unlinked = [name(page) for page in sorted(DOCS.glob("*.md")) if page not in reached]
    assert unlinked == [], f"link these from README.md (or a page it links): {unlinked}"


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_repository_path_named_exists(page: Path) -> None:
    """A path in `code` (tpuctl/…, tests/…, scripts/…, configs/…, docs/…) and every example spec
    (configs/*.yaml, code blocks included) names something that exists."""
    named = [
        span.split()[0].rstrip(".,;:")
        for span in code_spans(page)
        if span.startswith(REPOSITORY_ROOTS) and not _NOT_A_PATH.search(span.split()[0])
    ]
    named += _EXAMPLE_SPEC.findall(page.read_text(encoding="utf-8"))
    missing = sorted({path for path in named if not (REPO / path).exists()})
    assert missing == [], f"{name(page)} names paths that do not exist: {missing}"


def test_the_readme_stays_a_first_read() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to a docs/ page"
    )
    text = README.read_text(encoding="utf-8")
    for command in ("scripts/demo", "scripts/test"):
        assert re.search(rf"^{command}\b", text, re.M), f"README.md no longer shows `{command}`"


def test_every_variable_the_job_is_given_is_documented() -> None:
    """docs/job.md lists each variable the startup script puts in the job's environment."""
    from tpuctl.spec.frameworks import Checkpointing, checkpointing_environment

    script = (REPO / "tpuctl" / "render" / "startup.sh").read_text(encoding="utf-8")
    blocks = re.findall(r"JOB_ENVIRONMENT\+?=\((.*?)\)(?=\s*(?:;|#|$))", script, re.M | re.S)
    given = {name for block in blocks for name in re.findall(r'"([A-Z_][A-Z0-9_]*)=', block)}
    given |= set(checkpointing_environment(Checkpointing(True, True, 3, True)))
    assert {"TPUCTL_BOOT", "TPUCTL_DONE_MARKER", "TPUCTL_WORKERS_PER_SLICE"} <= given
    documented = set(re.findall(r"`([A-Z_][A-Z0-9_]*)`", (DOCS / "job.md").read_text("utf-8")))
    missing = sorted(given - documented)
    assert missing == [], f"document {missing} in docs/job.md's environment table"
