"""The job's command as a shell sees it: where the framework's flags may go, and which flags the
user already wrote (tpuctl then uses their values everywhere it looks).

A command is a shell line (`python3 train.py --steps 10`) or an argv list (each word quoted when
rendered). Flags are appended to a simple command. A compound line (a pipeline, `;`, `&&`, a
trailing `&`, a `# comment`, `{ …; }` or a subshell) has no safe end to append to: the user marks
the place with `{flags}` (`{ python3 paxml/main.py {flags}; } 2>&1 | tee pax_logs.txt`), or
writes the command as a list.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

FLAGS_PLACEHOLDER = "{flags}"
# Control operators: what ends or joins commands, so that flags appended would land elsewhere.
_OPERATORS = {
    "|": "a pipeline (|)",
    "|&": "a pipeline (|&)",
    "||": "a list (||)",
    "&&": "a list (&&)",
    ";": "a list (;)",
    ";;": "a case branch (;;)",
    "&": "a background job (&)",
    "(": "a subshell ( … )",
    ")": "a subshell ( … )",
}
_GROUP_WORDS = {
    "{": "a group { …; }",
    "}": "a group { …; }",
    "if": "an if",
    "for": "a for loop",
    "while": "a while loop",
    "until": "an until loop",
    "case": "a case",
}


@dataclass(frozen=True)
class CommandShape:
    """What tpuctl needs to know about a command line before it adds flags to it."""

    line: str
    words: tuple[str, ...]  # the shell words, best effort (operators included)
    placeholder: bool  # `{flags}` marks where the flags go
    compound: str | None  # why appending at the end would miss the program, or None

    @property
    def needs_placement(self) -> bool:
        return self.compound is not None and not self.placeholder


def command_line(command: str | Sequence[str]) -> str:
    """The shell line for a command: a string as it is; an argv list with each word quoted, a
    `{flags}` element kept as the placeholder."""
    if isinstance(command, str):
        return command
    return " ".join(
        FLAGS_PLACEHOLDER if word == FLAGS_PLACEHOLDER else shlex.quote(word) for word in command
    )


def analyse(line: str) -> CommandShape:
    """The shape of a shell line; ValueError for unbalanced quotes."""
    placeholder = FLAGS_PLACEHOLDER in line
    if "\n" in line.strip():
        return CommandShape(line, tuple(line.split()), placeholder, "several lines")
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""  # a comment is something to report, not to drop
    try:
        words = tuple(lexer)
    except ValueError as error:
        raise ValueError(f"cannot split the command into words: {error}") from None
    compound: str | None = None
    for index, word in enumerate(words):
        if word in _OPERATORS:
            compound = _OPERATORS[word]
        elif word.startswith("#") and word != FLAGS_PLACEHOLDER:
            compound = "a # comment"
        elif index == 0 and word in _GROUP_WORDS:
            compound = _GROUP_WORDS[word]
        if compound is not None:
            break
    return CommandShape(line, words, placeholder, compound)


def given_flags(words: Sequence[str]) -> dict[str, str]:
    """The flags a command already sets, by name without dashes: `name=value`, `--name=value`,
    and absl's `--name value`. The last one wins, as in the programs that read them."""
    found: dict[str, str] = {}
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        bare = name.lstrip("-")
        if not bare or not bare.replace("_", "").replace(".", "").isalnum():
            continue
        if equals:
            found[bare] = value
        elif name.startswith("--") and index + 1 < len(words):
            following = words[index + 1]
            if not following.startswith("-") and following not in _OPERATORS:
                found[bare] = following
    return found


def place_flags(line: str, flags: str) -> str:
    """The line with `flags` (already shell words) where they belong: at `{flags}`, else at the
    end. The startup script does the same in bash, with values only the worker knows."""
    if FLAGS_PLACEHOLDER in line:
        return line.replace(FLAGS_PLACEHOLDER, flags)
    return f"{line} {flags}" if flags else line
