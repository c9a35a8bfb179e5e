"""A quicker `__init__` for the frozen slots dataclasses every record is opened into.

`dataclasses` gives a frozen class an `__init__` that sets each field with `object.__setattr__` (the class's
own `__setattr__` refuses), about 0.1 us a field; the projector builds some 60 fields of such values per
record (the record, its envelope twice, the event and its blobs, the opened outcome). The `__init__` made
here sets each slot through its descriptor, in half the time, with the same parameters, defaults and
immutability.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T", bound=type)


def quick_init(cls: T) -> T:
    """Class decorator, over `@dataclass(frozen=True, slots=True)`: replace the generated `__init__` (a class
    with `__post_init__`, a `default_factory`, a keyword-only or a non-init field is refused)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: quick_init is for frozen slots dataclasses")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: quick_init does not run __post_init__")
    scope: dict[str, Any] = {}
    signature, body = [], []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING or f.kw_only or not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: quick_init takes positional fields with plain defaults")
        scope[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is dataclasses.MISSING:
            signature.append(f.name)
        else:
            scope[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})\n")
    # The source is made of the class's field names only.
    exec(f"def __init__(self, {', '.join(signature)}):\n" + ("".join(body) or "    pass\n"), scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = vars(cls)["__init__"].__doc__
    cls.__init__ = init  # type: ignore[misc]  # same signature, quicker
    return cls
