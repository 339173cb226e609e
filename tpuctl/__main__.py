"""`python -m tpuctl` runs the CLI."""

import gc

gc.set_threshold(10_000, 10, 10)  # before the CLI's imports: see tpuctl.cli.main.fewer_collections

from tpuctl.cli.main import main  # noqa: E402

main()
