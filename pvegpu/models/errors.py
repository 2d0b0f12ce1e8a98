"""Domain errors of the models layer."""

from __future__ import annotations

from collections.abc import Sequence


class InventoryError(ValueError):
    """Declared inventory data is invalid. `problems` holds one `<host>: path.to.field: message` per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))
