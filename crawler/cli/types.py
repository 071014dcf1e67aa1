"""Click parameter types for numbers: finite floats only, for every float option of the CLI.

``float("nan")`` and ``float("inf")`` parse, and NaN passes any range check (it fails
every comparison): a NaN interval stored live stopped every download worker of the site.
``FINITE_FLOAT`` refuses them as click refuses a word (usage, one ``Error:`` line, exit
status 2). Ranges stay with the settings' checks (``settings.check_interval``, …), the
same for the CLI, the config file and the environment.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.types.FloatParamType):
    """A float that must be finite: not ``nan``, ``inf`` or ``-inf`` (in any spelling float() reads)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)  # 'abc' fails here, as click's FLOAT says
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


#: The type of every float option of the CLI.
FINITE_FLOAT = FiniteFloat()
