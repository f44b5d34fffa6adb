"""The one error a configuration raises: every problem found, one per line, each naming its field."""

from __future__ import annotations

from bertdist.errors import UserError


class ConfigError(UserError, ValueError):
    """Raised with every problem found in a configuration, one per line, each naming its field."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))
