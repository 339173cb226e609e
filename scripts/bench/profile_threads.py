#!/usr/bin/env python3
"""Profile one tpuctl command in every thread, on each thread's CPU clock.

`python -m cProfile -m tpuctl …` sees only the main thread; a fan-out spends most of its CPU
in paramiko's transport threads (one per worker: packets, ciphers, MACs) and tpuctl's set-up
threads (handshake, auth, host-key checks). Here every thread gets its own cProfile.Profile
timed by time.thread_time (CPU seconds, not seconds spent blocked), started before the
thread's run() (so it covers Thread subclasses such as paramiko.Transport), and all of them
are merged into one pstats file. tottime is then CPU, summed over threads; cumulative is CPU
below a function in the threads that called it. Profiling itself slows Python code down
(about 1.5–2× here), C code (cryptography) much less, so read shares, not seconds.

    profile_threads.py OUT.prof -- ssh SPEC -- true      # runs tpuctl with these arguments
    profile_threads.py --show OUT.prof [--top 25]       # tottime, and cumulative in tpuctl/
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def profile(out: Path, args: list[str]) -> int:
    finished: list[cProfile.Profile] = []
    lock = threading.Lock()
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def profiled_bootstrap(thread: threading.Thread) -> None:
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        try:
            bootstrap(thread)
        finally:
            profiler.disable()
            with lock:
                finished.append(profiler)

    threading.Thread._bootstrap_inner = profiled_bootstrap  # type: ignore[attr-defined]
    main = cProfile.Profile(time.thread_time)
    code = 1
    started = time.perf_counter()
    main.enable()
    try:
        sys.path.insert(0, str(REPO))
        from tpuctl.cli.main import run

        code = run(args)
    finally:
        main.disable()
        wall = time.perf_counter() - started
        with lock:
            others = list(finished)
        # A thread still running is left out: its profiler is still being written to.
        alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        stats = pstats.Stats(main)
        for profiler in others:
            stats.add(profiler)
        stats.dump_stats(str(out))
        print(
            f"profile_threads: {len(others) + 1} threads profiled ({len(alive)} still running "
            f"at exit), wall {wall:.2f} s; wrote {out}",
            file=sys.stderr,
        )
    return code


def show(path: Path, top: int) -> None:
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"{path}: {total:.2f} s of thread CPU in all, {stats.total_calls} calls")  # type: ignore[attr-defined]
    stats.sort_stats("tottime")
    print(f"\n-- top {top} by tottime (CPU in the function itself, all threads) --")
    stats.print_stats(top)
    stats.sort_stats("cumulative")
    print(f"\n-- top {top} by cumulative, tpuctl's own functions --")
    stats.print_stats(r"tpuctl/(?!emulator)", top)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--show":
        parser = argparse.ArgumentParser()
        parser.add_argument("--show", type=Path, required=True)
        parser.add_argument("--top", type=int, default=25)
        options = parser.parse_args()
        show(options.show, options.top)
        return 0
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    return profile(Path(sys.argv[1]), sys.argv[3:])


if __name__ == "__main__":
    sys.exit(main())
