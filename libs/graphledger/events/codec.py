"""Event payloads from their dataclass fields: one codec per event class, made once with the class.

A field's type says how it travels and what a decoded value must be: `str` a string without NUL,
`bytes` bytes, `bool`, `int` an integer (never a bool), `float` a finite number, `X | None` X or
null, `tuple[str, ...]` a list of strings, `tuple[Row, ...]` a list of rows, each the list of a row
dataclass's fields in order. What a type cannot say, a field says in its metadata, `wire(...)`:
the payload's name for it, a finer `Kind` (a bound, a choice, a format), and a default that is left
out of the payload and read when the payload has none.

Every refusal is an `InvalidEventError` naming the field and the bad value; bytes and rows only by
their type and shape, since they hold user content, which reaches logs through the reason. Fields
are checked in their order, so of a payload with several bad fields the first is named.

`to_payload` and `from_payload` are compiled per class, as `dataclasses` compiles `__init__`: the
client encodes several events per turn and the projector decodes every record. A value its kind
accepts at a glance (`accepts_expr`: a string without NUL, bytes, an int in range) is kept without a
call, and rows are converted inline, so they cost what hand-written code would: a CheckpointPut of six
blobs encodes and decodes in about 9 us (timeit, one core).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, Self, TypeVar

from graphledger.errors import InvalidEventError
from graphledger.events.envelope import MAX_EPOCH_MS

_WIRE = "graphledger.wire"
"""The metadata key of a field's `Wire`."""

Bind = Callable[[object], str]
"""Names an object in the compiled code (a kind's `decode`, a default), returning the name."""


class Kind:
    """How one field travels: `decode` checks a payload value, `encode` gives the payload form."""

    def decode(self, value: Any, name: str) -> Any:
        raise NotImplementedError

    def encode(self, value: Any) -> Any:
        """The payload form of a decoded value (as it is, unless a kind says otherwise)."""
        return value

    def encode_expr(self, value: str, bind: Bind) -> str:
        """Python source of the payload form of `value` (source of an attribute), for the compiled encoder."""
        return value if type(self).encode is Kind.encode else f"{bind(self.encode)}({value})"

    def accepts_expr(self, value: str, bind: Bind) -> str | None:
        """Python source of a test that `value` (a variable) is valid and decodes to itself, or None: where
        it holds, the compiled decoder keeps the value without calling `decode` (which says what is wrong)."""
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Text(Kind):
    """A string without NUL, not empty if `nonempty`; `nul_apart`: a NUL is refused with a message of its
    own ("contains a NUL character"), else the one message says "without NUL"."""

    nonempty: bool = False
    nul_apart: bool = True

    def accepts_expr(self, value: str, bind: Bind) -> str:
        return f"type({value}) is str and '\\x00' not in {value}" + (f" and {value} != ''" if self.nonempty else "")

    def decode(self, value: Any, name: str) -> str:
        if isinstance(value, str) and "\x00" not in value and (value or not self.nonempty):
            return value
        if isinstance(value, str) and (value or not self.nonempty) and self.nul_apart:
            raise InvalidEventError(f"{name} {value!r} contains a NUL character")
        expected = f"a{' non-empty' if self.nonempty else ''} string{'' if self.nul_apart else ' without NUL'}"
        raise InvalidEventError(f"{name} {value!r} is not {expected}")


_TEXT = Text()


@dataclasses.dataclass(frozen=True, slots=True)
class Bytes(Kind):
    def accepts_expr(self, value: str, bind: Bind) -> str:
        return f"type({value}) is bytes"

    def decode(self, value: Any, name: str) -> bytes:
        if not isinstance(value, bytes):
            raise InvalidEventError(f"{name} is a {type(value).__name__}, not bytes")
        return value


@dataclasses.dataclass(frozen=True, slots=True)
class Flag(Kind):
    def accepts_expr(self, value: str, bind: Bind) -> str:
        return f"type({value}) is bool"

    def decode(self, value: Any, name: str) -> bool:
        if not isinstance(value, bool):
            raise InvalidEventError(f"{name} {value!r} is not a bool")
        return value


@dataclasses.dataclass(frozen=True, slots=True)
class Integer(Kind):
    """An integer, never a bool, from `least` to `most` where given; `expected` says so in words."""

    least: int | None = None
    most: int | None = None
    expected: str = ""
    _low: float = dataclasses.field(init=False, repr=False, compare=False)
    _high: float = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_low", -math.inf if self.least is None else self.least)
        object.__setattr__(self, "_high", math.inf if self.most is None else self.most)

    def accepts_expr(self, value: str, bind: Bind) -> str:
        bounds = (
            ""
            if self.least is None and self.most is None
            else f" and {bind(self._low)} <= {value} <= {bind(self._high)}"
        )
        return f"type({value}) is int{bounds}"

    def decode(self, value: Any, name: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and self._low <= value <= self._high:
            return value
        raise InvalidEventError(f"{name} {value!r} is not {self.expected or self._range()}")

    def _range(self) -> str:
        if self.least is None:
            return "an integer"
        if self.most is None:
            return "a non-negative integer" if self.least == 0 else f"an integer of at least {self.least}"
        return f"an integer from {self.least} to {self.most}"


EPOCH_MS = Integer(0, MAX_EPOCH_MS, "a time in ms between 1970 and 9999")
"""A time in ms since the epoch, within what a timestamptz holds."""


@dataclasses.dataclass(frozen=True, slots=True)
class Number(Kind):
    """A finite number, decoded as a float; `expected` says so in words."""

    expected: str = "a finite number"

    def decode(self, value: Any, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidEventError(f"{name} {value!r} is not {self.expected}")
        return float(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Choice(Kind):
    """A string (as `Text`) that is one of `choices`; `noun` names it when it is not (default: the field)."""

    choices: tuple[str, ...]
    noun: str | None = None

    def decode(self, value: Any, name: str) -> str:
        text = _TEXT.decode(value, name)
        if text not in self.choices:
            raise InvalidEventError(f"{self.noun or name} {value!r} is not one of {self.choices}")
        return text


@dataclasses.dataclass(frozen=True, slots=True)
class Strings(Kind):
    """A tuple of strings, carried as a list."""

    def decode(self, value: Any, name: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise InvalidEventError(f"{name} {value!r} is not a list of strings")
        return tuple(value)

    def encode(self, value: tuple[str, ...]) -> list[str]:
        return list(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Nullable(Kind):
    """`inner`, or None (null)."""

    inner: Kind

    def decode(self, value: Any, name: str) -> Any:
        return None if value is None else self.inner.decode(value, name)

    def encode(self, value: Any) -> Any:
        return None if value is None else self.inner.encode(value)

    def encode_expr(self, value: str, bind: Bind) -> str:
        inner = self.inner.encode_expr(value, bind)
        return value if inner == value else f"(None if {value} is None else {inner})"

    def accepts_expr(self, value: str, bind: Bind) -> str | None:
        inner = self.inner.accepts_expr(value, bind)
        return None if inner is None else f"{value} is None or ({inner})"


@dataclasses.dataclass(frozen=True, slots=True)
class Rows(Kind):
    """A tuple of `row` dataclasses, carried as a list of lists of their fields in order; a cell is named
    by its label, or by the row's class and its field ("blob channel")."""

    row: type
    _decode: Callable[[Any, str], tuple[Any, ...]] = dataclasses.field(init=False, repr=False, compare=False)
    _fields: tuple[tuple[str, Kind], ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = _fields_of(self.row)
        prefix = self.row.__name__.lower()
        object.__setattr__(self, "_fields", tuple((f.name, kind) for f, _, kind in fields))
        compiler = _Compiler(self.row)
        width = len(fields)
        cells = [
            line
            for i, (f, spec, kind) in enumerate(fields)
            for line in _decoded(f"c{i}", f"r[{i}]", kind, spec.label or f"{prefix} {f.name}", compiler.bind)
        ]
        body = [
            "if not isinstance(value, list):",
            f"    {compiler.bind(_not_a_list)}(value, name)",
            "rows = []",
            "for i, r in enumerate(value):",
            f"    if not isinstance(r, list) or len(r) != {width}:",
            f"        {compiler.bind(_not_a_row)}(r, i, name, {width})",
            *(f"    {line}" for line in cells),
            f"    rows.append(_new({', '.join(f'c{i}' for i in range(width))}))",
            "return tuple(rows)",
        ]
        object.__setattr__(self, "_decode", compiler.function("rows", "value, name", body))

    def decode(self, value: Any, name: str) -> tuple[Any, ...]:
        return self._decode(value, name)

    def encode(self, value: tuple[Any, ...]) -> list[list[Any]]:
        return [[kind.encode(getattr(row, attr)) for attr, kind in self._fields] for row in value]

    def encode_expr(self, value: str, bind: Bind) -> str:
        cells = ", ".join(kind.encode_expr(f"_r.{attr}", bind) for attr, kind in self._fields)
        return f"[[{cells}] for _r in {value}]"


def _not_a_list(value: Any, name: str) -> NoReturn:
    raise InvalidEventError(f"{name} is a {type(value).__name__}, not a list")


def _not_a_row(row: Any, i: int, name: str, width: int) -> NoReturn:
    # The row's shape, never its content: rows hold channel values, which reach logs via the reason.
    shape = f"a list of {len(row)}" if isinstance(row, list) else f"a {type(row).__name__}"
    raise InvalidEventError(f"{name} row {i} is {shape}, not a list of {width}")


@dataclasses.dataclass(frozen=True, slots=True)
class Wire:
    """What a field says beyond its type."""

    name: str | None = None
    """The payload's name for the field (default: the field's)."""
    label: str | None = None
    """The field's name in an error message (default: the payload's)."""
    kind: Kind | None = None
    """How it travels (default: what its type says)."""
    omitted: bool = False
    """Left out of the payload when it is the field's default, which a payload without it reads as."""


def wire(
    name: str | None = None, *, label: str | None = None, kind: Kind | None = None, omitted: bool = False
) -> dict[str, Wire]:
    """The metadata of a dataclass field that says what its type cannot: `field(metadata=wire(...))`."""
    return {_WIRE: Wire(name, label, kind, omitted)}


_BY_TYPE: dict[object, Kind] = {str: Text(), bytes: Bytes(), bool: Flag(), int: Integer(), float: Number()}


def kind_of(hint: object) -> Kind:
    """The kind a field's type says."""
    if hint in _BY_TYPE:
        return _BY_TYPE[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        return Nullable(kind_of(next(a for a in args if a is not type(None))))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if args[0] is str:
            return Strings()
        if isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
            return Rows(args[0])
    raise TypeError(f"no payload kind for {hint!r}: give the field metadata=wire(kind=...)")


def _fields_of(cls: type) -> list[tuple[dataclasses.Field[Any], Wire, Kind]]:
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_WIRE, Wire())
        if spec.omitted and f.default is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} is left out of the payload as its default, but has none")
        found.append((f, spec, spec.kind or kind_of(hints[f.name])))
    return found


class _Compiler:
    """Source of one function, and the objects it names."""

    def __init__(self, new: type) -> None:
        self.scope: dict[str, object] = {"_new": new}
        self._names = itertools.count()

    def bind(self, obj: object) -> str:
        name = f"_{next(self._names)}"
        self.scope[name] = obj
        return name

    def function(self, name: str, params: str, body: list[str]) -> Any:
        source = f"def {name}({params}):\n" + "".join(f"    {line}\n" for line in body)
        # The source is made of field names and reprs of payload names and labels, never of a payload.
        exec(source, self.scope)
        return self.scope[name]


def _decoded(var: str, source: str, kind: Kind, label: str, bind: Bind) -> list[str]:
    """Statements setting `var` to the decoded value of `source`, refused as `label` when it is wrong."""
    decode = bind(kind.decode)
    test = kind.accepts_expr(var, bind)
    if test is None:
        return [f"{var} = {decode}({source}, {label!r})"]
    return [f"{var} = {source}", f"if not ({test}):", f"    {var} = {decode}({var}, {label!r})"]


def _compile(cls: type) -> tuple[Callable[[Any], dict[str, Any]], Callable[[Mapping[str, Any]], Any]]:
    """The class's encoder and decoder."""
    fields = _fields_of(cls)
    compiler = _Compiler(cls)
    bind = compiler.bind
    decoding, body, literal = ["get = p.get"], [], []
    for i, (f, spec, kind) in enumerate(fields):
        key = spec.name or f.name
        default = bind(f.default) if spec.omitted else None
        absent = f", {default}" if default else ""
        decoding += _decoded(f"v{i}", f"get({key!r}{absent})", kind, spec.label or key, bind)
        value = kind.encode_expr(f"e.{f.name}", bind)
        if default:
            body += [f"if e.{f.name} != {default}:", f"    p[{key!r}] = {value}"]
        elif body:
            body.append(f"p[{key!r}] = {value}")
        else:
            literal.append(f"{key!r}: {value}")
    encode = compiler.function("to_payload", "e", [f"p = {{{', '.join(literal)}}}", *body, "return p"])
    decode = compiler.function(
        "from_payload", "p", [*decoding, f"return _new({', '.join(f'v{i}' for i in range(len(fields)))})"]
    )
    return encode, decode


class EventPayload:
    """Base of the event dataclasses: `to_payload` and `from_payload`, compiled by `@payload_codec`."""

    __slots__ = ()

    def to_payload(self) -> dict[str, Any]:
        """The payload map of the event (its envelope's `p`)."""
        raise TypeError(f"{type(self).__name__} has no payload codec: decorate it with @payload_codec")

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Self:
        """The event of a payload; `InvalidEventError` names the first bad field and its value."""
        raise TypeError(f"{cls.__name__} has no payload codec: decorate it with @payload_codec")


P = TypeVar("P", bound=type[EventPayload])


def payload_codec(cls: P) -> P:
    """Class decorator, over `@dataclass`: compile the class's `to_payload` and `from_payload` from its
    fields, once."""
    encode, decode = _compile(cls)
    # The compiled functions replace the base's stubs, whose signatures they keep.
    cls.to_payload = encode  # type: ignore[method-assign, assignment]  # same signature, compiled
    cls.from_payload = staticmethod(decode)  # type: ignore[method-assign, assignment]  # as above
    return cls
