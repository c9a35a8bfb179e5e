"""`quick_init`: the same values as the `__init__` dataclasses generates, still frozen, or a refusal."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from graphledger.quick_init import quick_init


@dataclass(frozen=True, slots=True)
class _Generated:
    a: str
    b: int = 2
    c: tuple[int, ...] = ()


@quick_init
@dataclass(frozen=True, slots=True)
class _Quick:
    a: str
    b: int = 2
    c: tuple[int, ...] = ()


def test_the_quick_init_makes_what_the_generated_one_makes_and_stays_frozen() -> None:
    for args, kwargs in (((("x",), {})), (("x", 5), {}), (("x",), {"c": (1,)}), ((), {"a": "y", "b": 0})):
        quick, generated = _Quick(*args, **kwargs), _Generated(*args, **kwargs)
        assert dataclasses.astuple(quick) == dataclasses.astuple(generated)
        assert hash(quick) == hash(_Quick(*args, **kwargs))
    assert _Quick("x") == _Quick("x", 2, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        _Quick("x").b = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        _Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick("x", 1, (), 4)  # type: ignore[call-arg]


def test_a_class_it_cannot_build_as_dataclasses_does_is_refused() -> None:
    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True)
    class Posted:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclass(slots=True)
    class Mutable:
        a: int

    for cls in (Factory, Posted, Unslotted, Mutable):
        with pytest.raises(TypeError):
            quick_init(cls)
