"""Build a :class:`~ziprl.config.schema.ZipRLConfig` from YAML: :func:`load_config` reads a file as plain data,
applies ``section.field=value`` overrides (:func:`apply_override`), coerces every value to its field's type
(:func:`from_dict`, naming an unknown or removed key and the closest known one) and validates the result."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import sys
import types
import typing
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from ziprl.boundary import shown
from ziprl.config.schema import PATH_FIELDS, ConfigError, ZipRLConfig


def _kind(value: Any) -> str:
    """How an error names a value of the wrong type: the kind for containers, the value itself for scalars."""
    if isinstance(value, dict):
        return "a mapping"
    return "a list" if isinstance(value, list) else "null" if value is None else shown(value)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML/CLI value to the annotated type, or raise ConfigError naming the field."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], where)
    if dataclasses.is_dataclass(tp):
        if value is None:  # an empty section (``env:`` alone) keeps its defaults
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {where.rsplit('.', 1)[-1]}'s fields, got "
                              f"{type(value).__name__}")
        return from_dict(tp, value, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {_kind(value)}")
        return [_coerce(v, item, where) for v in value]
    if value is None and tp in (bool, int, float, str):
        raise ConfigError(f"{where}: expected {'a path' if where in PATH_FIELDS else tp.__name__}, got null")
    try:
        if isinstance(value, (list, dict)) and tp in (bool, int, float, str):
            raise ValueError(value)
        if tp is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if tp in (int, float) and isinstance(value, bool):
            raise ValueError(value)
        if tp is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        if tp in (int, float, str):
            return tp(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {_kind(value)}") from None
    return value


REMOVED = {  # dotted key: what replaced it (named in the error a config that still sets it gets)
    "ray.queue_size": "admission follows the staleness capacity rule now (ray.max_staleness); delete the key",
}


def _removed(keys: Any, where: str) -> str:
    """The REMOVED notes for any of ``keys`` (in section ``where``), as an error suffix."""
    notes = [f"{where}.{k}".lstrip(".") for k in keys if f"{where}.{k}".lstrip(".") in REMOVED]
    return "".join(f"; {k} was removed: {REMOVED[k]}" for k in notes)


def _did_you_mean(keys: Any, names: Any) -> str:
    """``did you mean 'x'? `` for the known names closest to the unknown ``keys``, as an error suffix."""
    close = [m for k in keys for m in difflib.get_close_matches(str(k), sorted(names), n=1)]
    return f"did you mean {' / '.join(map(repr, dict.fromkeys(close)))}? " if close else ""


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build config dataclass ``cls`` from a plain dict (nested sections too), each value coerced to its field's type.

    Unknown keys raise ConfigError naming ``where`` (the dotted path); missing keys keep their defaults; no
    ``validate()`` here. The inverse of ``to_dict()`` (configs sent to Ray actors, env configs given as dicts).
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(data) - names))
    if unknown:
        raise ConfigError(f"unknown config key(s) [{', '.join(map(shown, unknown))}] in {where or 'top level'}; "
                          f"{_did_you_mean(unknown, names)}"
                          f"known: {sorted(names)}" + _removed(unknown, where))
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}".lstrip(".")) for k, v in data.items()}
    return cls(**kwargs)


PLAIN_TAGS = tuple(f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "seq", "map"))
MAX_DEPTH = 16  # nesting of lists and mappings in one config value; the deepest config field needs 3
MAX_CONFIG_BYTES = 1 << 20
PLAIN_DATA = "config values are plain data: strings, numbers, booleans, null, lists and mappings"
BOOL_TAG = "tag:yaml.org,2002:bool"
YAML12_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


class _NotPlainData(Exception):
    """A YAML document uses a feature beyond plain data (a tag, an anchor or alias, deep nesting)."""


@functools.cache
def _plain_loader() -> type:
    """A SafeLoader that builds plain data only: the tags of PLAIN_TAGS (dates, ``=`` and ``<<`` stay strings),
    no anchors or aliases (so no alias bomb can expand), nesting at most MAX_DEPTH levels, no key given twice in a
    mapping (PyYAML would keep the last silently)."""
    import yaml

    def refuse(loader: Any, node: Any) -> Any:
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise _NotPlainData(f"line {node.start_mark.line + 1}: YAML tag {tag} is not allowed; {PLAIN_DATA}")

    plain = set(PLAIN_TAGS)

    class PlainLoader(yaml.SafeLoader):
        yaml_constructors = {**{t: yaml.SafeLoader.yaml_constructors[t] for t in PLAIN_TAGS}, None: refuse}
        yaml_multi_constructors: dict = {}
        yaml_implicit_resolvers = _resolvers(yaml.SafeLoader.yaml_implicit_resolvers, plain)
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            line = event.start_mark.line + 1
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise _NotPlainData(f"line {line}: YAML anchors and aliases (&name, *name) are not allowed; write the "
                                    "values out")
            if self.depth >= MAX_DEPTH:
                raise _NotPlainData(f"line {line}: values nested more than {MAX_DEPTH} levels deep are not allowed")
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            first: dict[Any, int] = {}  # key -> the line it is first given on
            for key_node, _ in node.value:
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                if not isinstance(key, Hashable):
                    continue  # SafeLoader refuses it
                if key in first:
                    raise _NotPlainData(f"line {line}: key {shown(key)} is given twice (first on line {first[key]}); "
                                        "keep one")
                first[key] = line
            return super().construct_mapping(node, deep)

    return PlainLoader


def _resolvers(safe: dict[Any, list[tuple[str, Any]]], plain: set[str]) -> dict[Any, list[tuple[str, Any]]]:
    """SafeLoader's implicit resolvers (``safe``) of the ``plain`` tags, booleans spelled as YAML 1.2 spells them:
    true and false only, so off, on, yes and no stay words (a boolean field still reads them as booleans, and a word
    field such as rollout.overlap=off keeps the word)."""
    out = {c: [(t, r) for t, r in rs if t in plain and t != BOOL_TAG] for c, rs in safe.items()}
    for c in "tTfF":
        out.setdefault(c, []).insert(0, (BOOL_TAG, YAML12_BOOL))
    return out


def _yaml_problem(exc: Exception) -> str:
    """A YAML parse error in one line: where, and what is wrong."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    if isinstance(getattr(exc, "character", None), int):  # a ReaderError
        return f"character #x{exc.character:04x} at position {exc.position} is not allowed in YAML"
    return " ".join(str(exc).split())


def yaml_value(text: str, where: str) -> Any:
    """Parse YAML text (a config file or a ``--set`` value) into plain data; ConfigError prefixed by ``where``."""
    import yaml

    if "\0" in text:  # YAML allows no NUL, and a path holding one could never be opened
        raise ConfigError(f"{where}: holds a NUL byte (\\0) at position {text.index(chr(0))}; remove it")
    try:
        return yaml.load(text, Loader=_plain_loader())  # noqa: S506 (the loader builds plain data only)
    except _NotPlainData as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ValueError:  # the one a plain loader raises: an integer too long for int()
        raise ConfigError(f"{where}: a number of more than {sys.get_int_max_str_digits()} digits; write a smaller one, "
                          "or quote it for text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({_yaml_problem(exc)}); check its brackets and quotes (quote a "
                          "string holding ': ', '#', '[' or '{')") from None


def _is_section(value: Any) -> bool:
    """Whether a config field's ``value`` is a config section (a dataclass instance, not a dataclass class)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def apply_override(cfg: ZipRLConfig, dotted: str) -> None:
    """Apply one ``section.field=value`` override in place."""
    if "=" not in dotted:
        raise ConfigError(f"override {shown(dotted)} must look like section.field=value")
    key, raw = dotted.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {shown(dotted)}: name a field as section.field=value, e.g. env.max_turns=6")
    obj: Any = cfg
    parts = key.split(".")
    for p in parts[:-1]:  # through fields holding config sections only: no attribute such as __class__
        sections = [f.name for f in dataclasses.fields(obj) if _is_section(getattr(obj, f.name))]
        if p not in sections:
            raise ConfigError(f"override {shown(key)}: no config section {shown(p)}; {_did_you_mean([p], sections)}"
                              f"sections: {sections}")
        obj = getattr(obj, p)
    name = parts[-1]
    hints = typing.get_type_hints(type(obj))
    if name not in hints:
        raise ConfigError(f"override {shown(key)}: {type(obj).__name__} has no field {shown(name)}; "
                          f"{_did_you_mean([name], hints)}known: {sorted(hints)}" + _removed([name], ".".join(parts[:-1])))
    setattr(obj, name, _coerce(yaml_value(raw, key) if raw else raw, hints[name], key))


def _read_config(p: Path) -> dict[str, Any]:
    """The sections of a YAML config file, as plain data; ConfigError naming the file and the fix."""
    where = f"config file {p}"
    if "\0" in str(p):
        raise ConfigError(f"config file path {shown(str(p))} holds a NUL byte (\\0); remove it")
    if p.is_dir():
        raise ConfigError(f"{where} is a directory; pass a YAML file, e.g. configs/laptop.yaml")
    if not p.exists():
        raise ConfigError(f"{where} does not exist; pass the path of a YAML file, e.g. configs/laptop.yaml")
    if not p.is_file():
        raise ConfigError(f"{where} is not a regular file; pass the path of a YAML file, e.g. configs/laptop.yaml")
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where} is {size} bytes; a config file is at most {MAX_CONFIG_BYTES}: is it the right "
                          "file?")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read ({exc.strerror or exc}); check that it exists and that you may "
                          "read it") from None
    data = yaml_value(text, where)
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = {list: "a list", int: "an int"}.get(type(data), f"a {type(data).__name__}")
        raise ConfigError(f"{where} holds {kind}, not a mapping of sections; write it as 'section:' lines, e.g. "
                          "'env:' then 'max_turns: 6' indented under it")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> ZipRLConfig:
    """Build the config: defaults, then the YAML file, then ``section.field=value`` overrides; validated.

    Files and ``--set`` values are read as plain data only (see :func:`yaml_value`): nothing is ever constructed
    from a YAML tag, anchors and aliases are refused, and a file is at most MAX_CONFIG_BYTES.
    """
    cfg = ZipRLConfig() if path is None else from_dict(ZipRLConfig, _read_config(Path(path)))
    for o in overrides or []:
        apply_override(cfg, o)
    return cfg.validate()


def differences(then: dict[str, typing.Any], now: dict[str, typing.Any], prefix: str = "") -> list[str]:
    """``section.field old then, new now`` for every leaf where two config dicts differ."""
    out = []
    for key in sorted(then.keys() | now.keys()):
        a, b = then.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {a!r} then, {b!r} now")
    return out
