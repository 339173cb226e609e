"""Run several gcloud command lines in one gcloud interpreter, the way gcloud's own tests do.

Each gcloud process spends about 0.6 s of CPU building its command tree before it sends one
request. Started through the `gcloud` wrapper itself, with this file in CLOUDSDK_PYTHON_ARGS,
it runs under the interpreter, arguments and environment the wrapper picks for gcloud:

    CLOUDSDK_PYTHON_ARGS=tests/e2e/gcloud_batch.py gcloud LINES.json RESULTS.json

The wrapper execs `python gcloud_batch.py …/lib/gcloud.py LINES.json RESULTS.json`. This file
then does what gcloud.py's main() does (its sys.path, its google package, gcloud_main), builds
the CLI once with gcloud_main.CreateCLI, and runs each command line of LINES.json (a list of
argument lists) through its Execute, as gcloud_main.main() runs the one of a process. RESULTS.json
gets each line's exit status. Only the standard library here: it runs on gcloud's Python."""

import importlib.util
import json
import sys


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def main() -> None:
    # Without its bundled Python the wrapper adds -S to these arguments, after this file's
    # name: what comes before gcloud.py is the wrapper's, not ours.
    words = sys.argv[1:]
    while words and not words[0].endswith("gcloud.py"):
        words.pop(0)
    gcloud_py, lines_path, results_path = words[:3]
    spec = importlib.util.spec_from_file_location("gcloud", gcloud_py)
    assert spec is not None and spec.loader is not None
    gcloud = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gcloud)  # puts gcloud's lib and third_party first on sys.path
    sys.path = gcloud.reorder_sys_path(sys.path)
    gcloud._fix_google_module()  # as gcloud.py's main() does
    gcloud_main = gcloud._import_gcloud_main()
    cli = gcloud_main.CreateCLI([])
    with open(lines_path, encoding="utf-8") as handle:
        lines = json.load(handle)
    results = []
    for args in lines:
        status = 0
        try:
            with gcloud_main.creds_context_managers.CredentialProvidersManager(None):
                cli.Execute(args)
        except SystemExit as stop:
            status = _exit_status(stop.code)
        except Exception as error:  # that line's failure, not the batch's
            print(f"gcloud {' '.join(args)}: {error!r}", file=sys.stderr)
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        results.append({"args": args, "status": status})
    with open(results_path, "w", encoding="utf-8") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
