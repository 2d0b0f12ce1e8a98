#!/usr/bin/env bash
# scripts/test.sh - THE test command (README (b)): install what is missing, then ruff, mypy --strict, the layer
# contracts (lint-imports, pyproject's [tool.importlinter]) and pytest with every tier (unit, lab, kernel).
# Run as root on Debian 12. Exits non-zero on the first failing step.
#
# Every tier must run here: PVEGPU_REQUIRE_TIERS=1 turns a tier's missing prerequisite into an error instead of
# a skip. Extra arguments go to pytest (e.g. `bash scripts/test.sh -k lab_facts -x`).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
started=$SECONDS
step() { printf '[test %4ds] %s\n' $((SECONDS - started)) "$*" >&2; }

step "bootstrap"
bash lab/bootstrap.sh
step "ruff check + format"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
step "mypy --strict"
.venv/bin/mypy
step "lint-imports (layer contracts)"
.venv/bin/lint-imports
step "pytest (unit, lab, kernel)"
PVEGPU_REQUIRE_TIERS=1 .venv/bin/pytest "$@"
step "all passed"
