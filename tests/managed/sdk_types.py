"""A strict check of a JSON value against an official SDK's request types (the `TypedDict`s of
the `openai` and `anthropic` packages): every required key present, no key the type does not
declare, every literal one the type names, every nested value checked the same way, each
union by its members. Pydantic's own validation ignores unknown keys and checks iterables
lazily, so it would let a misspelled key through; this walks the types itself."""

import collections.abc
import types
import typing

import typing_extensions


def problems(value, kind, at="$") -> list[str]:
    """What is wrong with `value` as a `kind`, each with where it is; empty when it fits."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if kind in (typing.Any, object) or isinstance(kind, typing.TypeVar):
        return []
    if origin in (typing.Annotated, typing_extensions.Annotated, typing_extensions.Required,
                  typing_extensions.NotRequired, typing.Required, typing.NotRequired):
        return problems(value, args[0], at)
    if origin in (typing.Union, types.UnionType):
        found = [problems(value, member, at) for member in args]
        if any(not p for p in found):
            return []
        # The member that got furthest into the value (deepest first fault, then fewest)
        # names what is wrong.
        def depth(faults):
            return max(f.split(":")[0].count(".") + f.split(":")[0].count("[") for f in faults)

        return min(found, key=lambda faults: (-depth(faults), len(faults)))
    if origin in (typing.Literal, typing_extensions.Literal):
        return [] if value in args else [f"{at}: {value!r} is not one of {args!r}"]
    if typing_extensions.is_typeddict(kind):
        if not isinstance(value, dict):
            return [f"{at}: {type(value).__name__} where {kind.__name__} is an object"]
        hints = typing.get_type_hints(kind, include_extras=True)
        out = [f"{at}: {kind.__name__} has no key {key!r}" for key in value if key not in hints]
        out += [f"{at}: {kind.__name__} needs {key!r}" for key in kind.__required_keys__ if key not in value]
        for key, item in value.items():
            if key in hints:
                out += problems(item, hints[key], f"{at}.{key}")
        return out
    if origin in (list, collections.abc.Iterable, collections.abc.Sequence, typing.List, typing.Iterable):
        if not isinstance(value, list):
            return [f"{at}: {type(value).__name__} where a list is expected"]
        item = args[0] if args else typing.Any
        return [p for i, element in enumerate(value) for p in problems(element, item, f"{at}[{i}]")]
    if origin in (dict, collections.abc.Mapping, typing.Dict):
        return [] if isinstance(value, dict) else [f"{at}: {type(value).__name__} where an object is expected"]
    if kind is type(None) or kind is None:
        return [] if value is None else [f"{at}: {value!r} where null is expected"]
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{at}: {value!r} is not a number"]
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{at}: {value!r} is not an integer"]
    if kind in (str, bool):
        return [] if isinstance(value, kind) else [f"{at}: {value!r} is not a {kind.__name__}"]
    if origin is not None:
        return problems(value, origin, at)
    if isinstance(kind, type):
        return [] if isinstance(value, kind) else [f"{at}: {type(value).__name__} where {kind.__name__} is expected"]
    return []
