"""Recipes: a dataclass of settings read from its defaults, a YAML file and the command line, in that order.

Every field is a YAML key and a command-line flag (``batch_size`` is ``--batch-size``; a bare boolean flag means true),
declared with :func:`setting`, whose help line ``--help`` shows.
A YAML recipe may name a ``base:`` recipe (a path relative to itself) whose values it overrides; its ``model_kwargs``
add to the base's, unless it names another model (whose arguments those are not) or gives ``{}``, which clears them.
Every value is checked against its field's type, and every unknown key or flag is refused with the closest valid one.
"""

import argparse
import dataclasses
import difflib
import json
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .errors import TrainingError

__all__ = ["BARE", "HELP", "parse_recipe", "setting"]

BARE = "bare"  # a field's metadata key: the value its flag takes when given bare (``--resume`` means "auto")
HELP = "help"  # a field's metadata key: its one line of ``--help``

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def setting(default: Any, help: str, bare: str | None = None) -> Any:
    """A settings field: its (immutable) default, the line ``--help`` shows for it, and the value its flag takes when
    given bare. A mutable default is ``dataclasses.field(default_factory=..., metadata={HELP: ...})``."""
    return dataclasses.field(default=default, metadata={HELP: help} | ({BARE: bare} if bare is not None else {}))


def _check_keys(fields: list[str], keys, source: str) -> None:
    for key in keys:
        if key not in fields:
            hint = difflib.get_close_matches(key, fields, n=1)
            did_you_mean = f" Did you mean {hint[0]!r}?" if hint else ""
            raise TrainingError(
                f"Unknown config key {key!r} in {source}.{did_you_mean} Valid keys: {', '.join(fields)}."
            )


def _coerce(name: str, annotation: Any, value: Any) -> Any:
    """A YAML or command-line value as the field's type, or exit naming the key."""
    optional = isinstance(annotation, types.UnionType) and type(None) in typing.get_args(annotation)
    base = next(a for a in typing.get_args(annotation) if a is not type(None)) if optional else annotation
    if value is None or (optional and str(value).lower() in ("none", "null")):
        if optional:
            return None
        raise TrainingError(f"Config key {name!r} cannot be empty.")
    try:
        if typing.get_origin(base) is tuple or base is dict:
            value = json.loads(value) if isinstance(value, str) else value
            if base is dict and not isinstance(value, dict):
                raise TypeError
            return value if base is dict else tuple(float(v) for v in value)
        if base is bool and isinstance(value, str):
            if value.lower() not in _TRUE + _FALSE:
                raise ValueError
            return value.lower() in _TRUE
        if base is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return base(value)
    except (TypeError, ValueError, json.JSONDecodeError):
        raise TrainingError(f"Config key {name!r} expects {annotation}, got {value!r}.") from None


def read_recipe(path: Path, fields: list[str], chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML recipe's values over those of the ``base:`` recipe it names, recursively."""
    if not path.is_file():
        raise TrainingError(f"Config file {path} does not exist.")
    if path.resolve() in {p.resolve() for p in chain}:
        raise TrainingError(
            f"Config files name each other as base in a cycle: {' -> '.join(map(str, (*chain, path)))}."
        )
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise TrainingError(f"Config file {path} is not valid YAML: {error}") from None
    if not isinstance(values, dict):
        raise TrainingError(f"Config file {path} must hold `key: value` lines, not {type(values).__name__}.")
    base = values.pop("base", None)
    _check_keys(fields, values, str(path))
    if base is None:
        return values
    base_values = read_recipe(path.parent / str(base), fields, (*chain, path))
    merged, kwargs = base_values | values, values.get("model_kwargs")
    if values.get("model", base_values.get("model")) != base_values.get("model"):
        merged["model_kwargs"] = kwargs if kwargs is not None else {}
    elif kwargs and isinstance(base_values.get("model_kwargs"), dict):
        merged["model_kwargs"] = base_values["model_kwargs"] | kwargs
    return merged


def parse_recipe(settings: type, argv: list[str] | None = None, description: str | None = None) -> dict[str, Any]:
    """The values set for the dataclass ``settings`` by ``--config FILE`` and the other flags of ``argv``, typed;
    fields set nowhere are left out (they keep their defaults)."""
    annotations = typing.get_type_hints(settings)
    metadata = {f.name: f.metadata for f in dataclasses.fields(settings)}
    defaults = settings()
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a YAML recipe (see configs/); the flags below override its keys")
    for name, annotation in annotations.items():
        # A bare flag means its field's BARE value, or true for a boolean (--overwrite).
        const = metadata[name].get(BARE, "true" if annotation is bool else None)
        help_line = f"{metadata[name][HELP]} (default: {getattr(defaults, name)!r})"
        parser.add_argument(
            "--" + name.replace("_", "-"), nargs="?" if const else None, const=const, default=argparse.SUPPRESS,
            help=help_line.replace("%", "%%"),  # argparse formats help with %
        )  # fmt: skip
    args, unknown = parser.parse_known_args(argv)
    for word in (w for w in unknown if w.startswith("--")):
        name = word[2:].split("=")[0]
        if name in annotations and "_" in name:
            raise TrainingError(
                f"Unknown flag {word.split('=')[0]}: flags use dashes, write --{name.replace('_', '-')}."
            )
        _check_keys(list(annotations), [name.replace("-", "_")], "the command line")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    values = read_recipe(Path(args.config), list(annotations)) if args.config else {}
    values.update({k: v for k, v in vars(args).items() if k != "config"})
    return {name: _coerce(name, annotations[name], value) for name, value in values.items()}
