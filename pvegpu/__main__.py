"""`python -m pvegpu` runs the `pvegpu` command line."""

from pvegpu.cli.main import main

main(prog_name="pvegpu")
