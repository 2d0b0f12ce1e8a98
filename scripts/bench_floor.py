"""pyinfra's floor for scripts/bench.py: one no-op operation per host (a directory every host has), so a run
costs what pyinfra itself costs: start, connect, one fact, the summary."""

from pyinfra.operations import files

files.directory(name="Ensure /tmp exists (the floor: always a no-op)", path="/tmp")
