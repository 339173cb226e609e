"""Shell completion on click's own mechanism: `tpuctl completion SHELL`, answering the shell,
and what NAME|SPEC and SPEC arguments complete to (queued resource names, spec files)."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, NoReturn

import click
from click.shell_completion import (
    BashComplete,
    CompletionItem,
    ZshComplete,
    add_completion_class,
    get_completion_class,
    shell_complete,
)

from tpuctl.cli.streams import instruction_variable, silence

PROG_NAME = "tpuctl"
SHELLS = ("bash", "zsh", "fish")
SPEC_SUFFIXES = (".yaml", ".yml")
# A completion that keeps the cursor waiting is worse than none: the API gets one try with this
# deadline, and the whole lookup (credentials, project resolution, the call) is abandoned after
# the second, whatever it is blocked on (google-auth probing the GCE metadata server, a
# black-holed endpoint).
# TPUCTL_COMPLETION_SECONDS replaces the lookup's deadline (a slow link, a loaded machine).
RPC_TIMEOUT_SECONDS = 2.0
LOOKUP_DEADLINE_SECONDS = 3.0
# Queued resource ids: lowercase letters, digits and hyphens, starting with a letter. A word
# that cannot start one (a path, ~, ./) is completed as a file without asking the API.
_NAME_PREFIX = re.compile(r"^([a-z][a-z0-9-]*)?$")


# ----------------------------------------------------------------------------- the scripts


class TpuctlBash(BashComplete):
    """click's bash script, plus: a lone directory completes without a trailing space, so the
    next TAB goes into it (click's script lets bash add one after every word)."""

    def source(self) -> str:
        loop_end = "    done\n\n    return 0\n"
        lone_directory = (
            "    done\n\n"
            '    if [[ ${#COMPREPLY[@]} -eq 1 && "${COMPREPLY[0]}" == */ ]]; then\n'
            "        compopt -o nospace 2>/dev/null\n"
            "    fi\n\n"
            "    return 0\n"
        )
        return super().source().replace(loop_end, lone_directory, 1)


class TpuctlZsh(ZshComplete):
    """click's zsh script, plus: directories (`dir/`) complete without a trailing space. (fish
    adds none after a `/` by itself.)"""

    def source(self) -> str:
        script = super().source()
        script = script.replace(
            "    local -a response\n",
            "    local -a response\n    local -a directories\n",
            1,
        )
        script = script.replace(
            '        if [[ "$type" == "plain" ]]; then\n            if [[ "$descr" == "_" ]]; then',
            '        if [[ "$type" == "plain" ]]; then\n'
            '            if [[ "$key" == */ ]]; then\n'
            '                directories+=("$key")\n'
            '            elif [[ "$descr" == "_" ]]; then',
            1,
        )
        return script.replace(
            '    if [ -n "$completions" ]; then',
            '    if [ -n "$directories" ]; then\n'
            "        compadd -U -S '' -V unsorted -a directories\n"
            "    fi\n\n"
            '    if [ -n "$completions" ]; then',
            1,
        )


add_completion_class(TpuctlBash, "bash")
add_completion_class(TpuctlZsh, "zsh")


def completion_script(shell: str, command: click.Command) -> str:
    """What `_TPUCTL_COMPLETE={shell}_source tpuctl` prints."""
    shell_class = get_completion_class(shell)
    if shell_class is None:  # SHELLS are click's own; this is a programming error
        raise LookupError(f"click has no completion for {shell}")
    return shell_class(command, {}, PROG_NAME, instruction_variable(PROG_NAME)).source()


@click.command()
@click.argument("shell", metavar="SHELL", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish) on stdout.

    It completes commands, options, spec files (*.yaml, *.yml) and queued resource names (as
    `tpuctl list` finds them, with the same project and zone; files only when that fails).
    Install it once:

    \b
      bash: eval "$(tpuctl completion bash)"        in ~/.bashrc
      zsh:  eval "$(tpuctl completion zsh)"         in ~/.zshrc, after compinit
      fish: tpuctl completion fish | source         in ~/.config/fish/config.fish
    """
    root = click.get_current_context().find_root().command
    click.echo(completion_script(shell, root), nl=False)


# ----------------------------------------------------------------------------- answering


def answer_shell(
    command: click.Command,
    ctx_args: MutableMapping[str, Any],
    prog_name: str,
    variable: str,
    instruction: str,
) -> NoReturn:
    """Answer the shell's instruction (`bash_complete`, `zsh_source`, …) and exit.

    While completing, nothing may reach the user's terminal but the answer: stderr goes to
    /dev/null for the whole process (library warnings, google-auth's retries, grpc's C core),
    and a failure is an empty answer, never a traceback.
    """
    answering = instruction.endswith("_complete")
    if answering:
        silence(sys.stderr)
    try:
        code = shell_complete(command, ctx_args, prog_name, variable, instruction)
    except Exception:
        code = 1
    if not answering:
        sys.exit(code)
    # A lookup abandoned at its deadline may still be blocked inside grpc or google-auth;
    # finalizing the interpreter around it could wait or crash, and there is nothing to clean.
    sys.stdout.flush()
    os._exit(code)


# ----------------------------------------------------------------------------- arguments


def complete_spec_path(
    _ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """SPEC: spec files (*.yaml, *.yml) and directories to look in."""
    return [CompletionItem(path) for path in spec_paths(incomplete)]


def complete_target(
    ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """NAME|SPEC: the queued resources `tpuctl list` shows, then spec files and directories."""
    names = []
    if _NAME_PREFIX.match(incomplete):
        names = [name for name in queued_resource_names(ctx.params) if name.startswith(incomplete)]
    return [CompletionItem(name) for name in [*names, *spec_paths(incomplete)]]


def spec_paths(incomplete: str) -> list[str]:
    """Directories (with a trailing /) and spec files whose path starts with `incomplete`,
    written as the user started it (relative, absolute or from ~); dot-files only when asked."""
    head, prefix = os.path.split(incomplete)
    try:
        entries = sorted(os.scandir(os.path.expanduser(head) or "."), key=lambda e: e.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.name.startswith(prefix) or (
            entry.name.startswith(".") and not prefix.startswith(".")
        ):
            continue
        path = os.path.join(head, entry.name)
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if is_dir:
            found.append(path + "/")
        elif entry.name.endswith(SPEC_SUFFIXES):
            found.append(path)
    return found


def queued_resource_names(params: Mapping[str, Any]) -> list[str]:
    """tpuctl's queued resources where `tpuctl list` (with the command's --project, --zone and
    --impersonate-service-account so far) would look; [] on any failure or at the deadline."""
    return within_deadline(_lookup_deadline(), lambda: _list_names(params))


def _lookup_deadline() -> float:
    try:
        seconds = float(os.environ.get("TPUCTL_COMPLETION_SECONDS", LOOKUP_DEADLINE_SECONDS))
    except ValueError:
        return LOOKUP_DEADLINE_SECONDS
    return seconds if seconds > 0 else LOOKUP_DEADLINE_SECONDS


def _list_names(params: Mapping[str, Any]) -> list[str]:
    from dataclasses import replace

    from tpuctl.cli.targets import connect_api, resolve_location_for
    from tpuctl.cloud import queries

    location = resolve_location_for(params.get("project"), params.get("zone"), None)
    api = connect_api(location, params.get("impersonate"))
    # The call gets the lookup's deadline less a second for credentials and project.
    rpc_timeout = max(RPC_TIMEOUT_SECONDS, _lookup_deadline() - 1.0)
    api = replace(api, retry_total=0.0, rpc_timeout=rpc_timeout)
    return [entry.name for entry in queries.list_queued_resources(api).queued_resources]


def within_deadline(seconds: float, fetch: Callable[[], list[str]]) -> list[str]:
    """fetch()'s answer, or [] when it raises or has not answered within `seconds` (it is then
    left running in a daemon thread, which cannot keep the process alive)."""
    answers: list[list[str]] = []

    def attempt() -> None:
        try:
            answers.append(fetch())
        except Exception:  # no credentials, no project, no network: complete files only
            return

    worker = threading.Thread(target=attempt, name="tpuctl-completion", daemon=True)
    worker.start()
    worker.join(seconds)
    return answers[0] if answers else []
