"""Dataset parameters: each one's type, default and allowed range (:class:`Param`), and the
check that a dict of them is valid (:func:`check_values`), with messages naming the key."""
from __future__ import annotations

import math
from typing import NamedTuple


def _number(value) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


class Param(NamedTuple):
    """One parameter. ``low``/``high`` bound it (inclusive unless ``open_low``/``open_high``);
    ``None`` is a valid value only when it is the default."""

    type: type
    default: object
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def describe(self) -> str:
        """What a valid value is, in words: 'an integer >= 2', 'a number in (0, 1)'."""
        kind = {bool: "true or false", int: "an integer"}.get(self.type, "a number")
        if self.low is not None and self.high is not None:
            return (f"{kind} in {'(' if self.open_low else '['}{_number(self.low)}, "
                    f"{_number(self.high)}{')' if self.open_high else ']'}")
        if self.low is not None:
            return f"{kind} {'>' if self.open_low else '>='} {_number(self.low)}"
        if self.high is not None:
            return f"{kind} {'<' if self.open_high else '<='} {_number(self.high)}"
        return kind

    def check(self, key: str, value):
        """``value`` converted to the parameter's type; ValueError naming ``key`` and the
        allowed values otherwise."""
        if value is None and self.default is None:
            return None
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
                math.isfinite(value)
        if ok and self.type is not bool:
            ok = self._in_range(value)
        if not ok:
            raise ValueError(f"'{key}' must be {self.describe()}, got {value!r}")
        return float(value) if self.type is float else value

    def _in_range(self, value) -> bool:
        if self.low is not None and (value < self.low or self.open_low and value == self.low):
            return False
        return self.high is None or not (value > self.high
                                         or self.open_high and value == self.high)


def check_values(spec: dict, params: dict, where: str, dataset: str) -> dict:
    """``params`` checked against ``spec`` ({name: Param}): unknown keys, wrong types and
    out-of-range values raise ValueError naming ``<where>.<key>``. Returns the given
    parameters (no defaults added), numbers converted to their types."""
    out = {}
    for key, value in (params or {}).items():
        if key not in spec:
            known = ", ".join(sorted(spec)) or "none"
            raise ValueError(f"unknown key '{where}.{key}' for dataset '{dataset}' "
                             f"(known: {known})")
        out[key] = spec[key].check(f"{where}.{key}", value)
    return out


def with_defaults(spec: dict, params: dict) -> dict:
    """Every parameter of ``spec``: the given value, else its default."""
    return {key: params.get(key, param.default) for key, param in spec.items()}
