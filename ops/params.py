"""An op's parameters, declared once.

Where it sits: each ops/<op>/spec.py declares its params as `Param`s; from
that one declaration come the op's argparse flags (`build_parser`, run by the
op's own `python -m ops.<op>`), the console's checks before a launch (`check`:
type, bounds, choices; exit 3 at `run`, not minutes into the program), the
defaults that `OpSpec.effective` merges, and the argv (ops/spec.py). The
console and the op can therefore never disagree about a flag.

Importing this stays cheap (argparse only where a parser is built).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import argparse


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


# The default of a param the stage must set (`input`, `output`).
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """One parameter: `name` in the pipeline file, `--name-with-dashes` on argv.

    `type` defaults to the default's type (bool, int, float, str); a param whose
    default is None names its type explicitly when it has one. `low`/`high` are
    inclusive bounds of numbers (`low_open`/`high_open`: the bound itself is
    refused, as in 0 < memory_fraction <= 1). `choices`: the only accepted values.
    `json`: a list of argv words carried as the JSON of the list (SGLang's
    extra_args), since the comma join of other lists would split it.
    `convert`: the op's own reading of a value that no type above says (train's
    length_bucket: "auto" or a whole number); argparse's type and check() both
    run it, ValueError saying what is wrong. `const`: what the bare flag means
    (a pipeline file's `true` writes it bare; false leaves the default).
    """

    name: str
    default: Any = REQUIRED
    help: str = ""
    type: type | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] | None = None
    json: bool = False
    metavar: str | None = None
    # False only for a custom stage's declared params: nan and inf are numbers
    # its program may take (the console judges types there, not values).
    finite: bool = True
    convert: "Callable[[str], Any] | None" = None
    const: Any = None

    @property
    def kind(self) -> type | None:
        if self.type is not None:
            return self.type
        if self.default is REQUIRED or self.default is None:
            return None
        return type(self.default) if isinstance(self.default, (bool, int, float, str)) else None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> str | None:
        """What is wrong with `value` for this param (None when it is fine).
        The console calls it before a launch and the op's argparse through
        `parse`, so both refuse the same values with the same words."""
        kind = self.kind
        if value is None and self.default is None:
            return None
        if self.const is not None and isinstance(value, bool):
            return None     # true: the bare flag (const); false: the flag left out
        if self.convert is not None:
            try:
                self.convert(str(value))
            except ValueError as exc:
                return f"{exc}, got {value!r}"
            return None
        if kind is bool:
            if not isinstance(value, bool):
                return f"expected true or false (default {self.default!r}), got {value!r}"
            return None
        if kind in (int, float):
            number = _number(kind, value)
            if number is None:
                want = "an integer" if kind is int else "a number"
                return f"expected {want} (default {self.default!r}), got {value!r}"
            if self.finite and not math.isfinite(number):
                return f"expected a finite number, got {value!r}"
            if self.low is not None and (number < self.low or (self.low_open and number == self.low)):
                return f"expected {self._range()}, got {value!r}"
            if self.high is not None and (number > self.high or (self.high_open and number == self.high)):
                return f"expected {self._range()}, got {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"expected one of {', '.join(map(str, self.choices))}, got {value!r}"
        return None

    def _range(self) -> str:
        lo = None if self.low is None else f"{'>' if self.low_open else '>='} {_fmt(self.low)}"
        hi = None if self.high is None else f"{'<' if self.high_open else '<='} {_fmt(self.high)}"
        return " and ".join(x for x in (lo, hi) if x)

    def parse(self, text: str) -> Any:
        """argparse's `type=` for this param: the value, or ArgumentTypeError
        with check()'s words."""
        import argparse
        kind = self.kind
        value: Any = text
        if self.convert is not None:
            try:
                return self.convert(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None
        if kind in (int, float):
            parsed = _number(kind, text)
            value = text if parsed is None else parsed
        wrong = self.check(value)
        if wrong:
            raise argparse.ArgumentTypeError(wrong)
        return value

    def add_to(self, parser: "argparse.ArgumentParser") -> None:
        import argparse
        kw: dict[str, Any] = {"dest": self.name, "help": self.help or None}
        if self.kind is bool:
            # --x / --no-x: argv() writes --no-x where the default is on.
            parser.add_argument(self.flag, action=argparse.BooleanOptionalAction, **kw)
            return
        if self.metavar or self.choices:
            kw["metavar"] = self.metavar or "{" + ",".join(map(str, self.choices or ())) + "}"
        if self.const is not None:
            kw.update(nargs="?", const=self.const)
        parser.add_argument(self.flag, type=self.parse, **kw)


def _number(kind: type, value: Any) -> float | int | None:
    if isinstance(value, bool):
        return None
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            if not value.isascii():     # int() reads any script's digits: "٣" is 3 there, a typo here
                return None
            try:
                return int(value)
            except ValueError:
                return None
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        if not value.isascii():
            return None
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


class ParamSet(Mapping[str, Any]):
    """An op's params: a mapping of name -> default (what the console has
    always read as `spec.params`), with each name's `Param` in `declared`."""

    def __init__(self, params: "Mapping[str, Any] | tuple[Param, ...] | list[Param]") -> None:
        if isinstance(params, Mapping):
            declared = {k: v if isinstance(v, Param) else Param(k, v) for k, v in params.items()}
        else:
            declared = {p.name: p for p in params}
            if len(declared) != len(params):
                raise ValueError("a param is declared twice")
        self.declared: dict[str, Param] = declared

    def __getitem__(self, key: str) -> Any:
        return self.declared[key].default

    def __iter__(self) -> Iterator[str]:
        return iter(self.declared)

    def __len__(self) -> int:
        return len(self.declared)

    def __repr__(self) -> str:
        return f"ParamSet({', '.join(self.declared)})"

    def check(self, key: str, value: Any) -> str | None:
        param = self.declared.get(key)
        return None if param is None else param.check(value)

    def defaults(self) -> dict[str, Any]:
        return {k: p.default for k, p in self.declared.items() if p.default is not REQUIRED}

    def required(self) -> list[str]:
        return sorted(k for k, p in self.declared.items() if p.default is REQUIRED)


def build_parser(spec: Any, prog: str | None = None, description: str | None = None, *,
                 target_required: bool = True,
                 target_help: str = "local Hugging Face model directory") -> "argparse.ArgumentParser":
    """The op's argparse, every flag from `spec.params` (and `--target` where the
    op takes the target: required unless the op can do without it, as
    verify's headers pass can). Add op-only flags to what it returns."""
    import argparse
    parser = argparse.ArgumentParser(prog=prog or f"python -m {spec.module or 'ops.' + spec.name}",
                                     description=description or spec.summary)
    if getattr(spec, "uses_target", False):
        parser.add_argument("--target", required=target_required, default=None, help=target_help)
    for param in spec.params.declared.values():
        param.add_to(parser)
    parser.set_defaults(**spec.params.defaults())
    for action in parser._actions:
        if action.dest in spec.params.declared and spec.params.declared[action.dest].default is REQUIRED:
            action.required = True
    return parser
