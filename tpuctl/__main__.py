"""`python -m tpuctl` runs the CLI."""

from tpuctl.cli.main import main

main()
