"""The generic run-config loader: OmegaConf structured configs whose schema is a recipe's config dataclass.

A run config is YAML plus dotted overrides (`value.train.max_steps=50`), with `${BUNDLE}` and
`${RUN}` placeholders (the restored bundle and the run folder) and `${...}` interpolation between
keys. Unknown keys are refused with the nearest valid name; wrong types name the key. The schema is the
recipe's (RECAP's: reproduction/recipes/recap/config.py); every key and its one-line doc is listed in
docs/config.md, generated from the dataclasses (`reference()`).

    recipe                      which recipe the config is for (`recap` when absent; see run/resolve.py):
                                read from the raw files and overrides before the schema is known
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import enum
import inspect
import re
import textwrap
from pathlib import Path, PurePath
from typing import Any

from reproduction.config_fields import SHOWN_VALUE_CHARS, shown
from reproduction.errors import ConfigError, InputNotFoundError

RECIPE_KEY = "recipe"
"""The top-level key naming a config's recipe."""
DEFAULT_RECIPE = "recap"
"""The recipe of a config (and a run folder) that names none: every run before recipes had names was RECAP."""


_UNNAMED = object()


def recipe_name(files: list[Path] | None, overrides: list[str] | None) -> str:
    """The recipe a config names (`given_recipe`), else DEFAULT_RECIPE."""
    return given_recipe(files, overrides) or DEFAULT_RECIPE


def given_recipe(files: list[Path] | None, overrides: list[str] | None) -> str | None:
    """The recipe a config names: the last `recipe` of the YAML files and the `recipe=...` overrides; None when
    none does. Read before the schema is known (the recipe brings its schema); ConfigError naming `recipe` when
    the value is not a non-empty string."""
    value: Any = _UNNAMED  # not None: `recipe: null` is a bad name, not an absent one
    where = ""  # the source of the last one, for the errors about it (audit60 D3)
    for path in files or []:
        node = _load_yaml(Path(path))
        if RECIPE_KEY in node:
            value, where = node[RECIPE_KEY], f"{path}: "
    for item in overrides or []:
        key, sep, text = item.partition("=")
        if sep and key.strip() == RECIPE_KEY:
            value, where = text.strip(), "command line: "
    if value is _UNNAMED:
        return None
    if isinstance(value, str) and "${" in value:  # read before anything resolves: an interpolation names no recipe
        raise ConfigError(
            f"{where}recipe: {shown(value)} is an interpolation; the recipe is read before the config resolves",
            field=RECIPE_KEY,
            hint="write the recipe's name: recipe=recap, or recipe=package.module:RECIPE",
        )
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"{where}recipe: {shown(value)} is not a recipe name",
            field=RECIPE_KEY,
            hint="write recipe: recap, or recipe: package.module:RECIPE for a recipe of your own",
        )
    return value.strip()


# -- loading --------------------------------------------------------------------------------------


def load_config(
    files: list[Path] | None = None,
    overrides: list[str] | None = None,
    *,
    bundle: Path | None = None,
    run_dir: Path | None = None,
    schema: type,
) -> Any:
    """The merged, resolved config as a typed `schema` instance (a recipe's config dataclass).

    Order: the schema's defaults, each YAML file, the dotted overrides, then BUNDLE/RUN (into the schema's `BUNDLE`
    and `RUN` fields, those it has: `${BUNDLE}` / `${RUN}` in a file refer to them). A schema without a
    `recipe` field has that key dropped (it named the recipe, which brought this schema). Raises
    InputNotFoundError (a file that is not there) or ConfigError (bad YAML, unknown key with the
    nearest valid name, wrong type, a missing value, a rule a config dataclass checks), each naming
    the key (and the file). Sections typed by a component's own config get that component's rules with their
    dotted key when the schema has a `component_checks()` ({section type: check(values, key=...)}).
    """
    from omegaconf import OmegaConf

    merged = merged_config(files, overrides, bundle=bundle, run_dir=run_dir, schema=schema)
    _refuse_empty_placeholders(merged, files, overrides)
    _refuse_misfit_section_interpolations(merged, files, overrides)
    _refuse_interpolated_non_bools(merged, files, overrides)
    checks = schema.component_checks() if hasattr(schema, "component_checks") else {}
    try:
        _resolve_keeping_escapes(merged)
        _check_component_sections(merged, checks=checks)
        config = OmegaConf.to_object(merged)
        # to_object does not re-check the items of a dict[str, X] / list[X] a whole container was merged into
        # (`cameras={a: [1]}`); rebuilding does, as --print-config and run.json do later (audit52 W1)
        OmegaConf.structured(config)
    except ConfigError as exc:  # a section's rule: name where its value came from, as the loader's errors do
        _name_source(exc, files, overrides, merged)
        raise
    except Exception as exc:  # omegaconf's errors: one mapping, here
        key = getattr(exc, "full_key", None)
        # omegaconf names an item of a nested tuple by its index alone (an int): no key (_source_of raised: exit 1)
        key = key if isinstance(key, str) else None
        found = None if key else _misfit_tuple_interpolation(merged, files, overrides)
        if found is None:  # an item the merge kept as it was given (a list or a mapping for a float: review61b 4, 6)
            try:
                found = _misfit_tuple_items(merged, OmegaConf.structured(schema), files, overrides, key)
            except Exception:
                found = None  # the diagnosis failed: omegaconf's own line, below
        if found is not None:
            raise found from None
        where = _source_of(key, files, overrides) if _is_interpolation(exc) or key else None
        raise _config_error(exc, merged, where=where) from None
    _refuse_nonfinite(config, schema, files, overrides)
    return config


def _resolve_keeping_escapes(merged: Any) -> None:
    """OmegaConf.resolve(merged) in place, keeping an escaped `\\${...}` (OmegaConf's escape for a literal `${...}`)
    a literal string: resolve sets each value to its result, so `\\${a}` became `${a}`, which the to_object after it
    resolved again (audit58 D5: `tag: '\\${advantages.lookahead}'` loaded as 10). A value whose result holds `${` is
    escaped once more after the resolve, so to_object gives the literal. Raises what resolve raises."""
    from omegaconf import OmegaConf

    try:
        results = OmegaConf.to_container(merged, resolve=True)
    except Exception:
        results = None  # a ${...} that fails: the resolve below raises it (no value is left to keep)
    OmegaConf.resolve(merged)
    if results is not None:
        _escape_literals(merged, results)


def _escape_literals(node: Any, results: Any) -> None:
    """Set each string value of `node` (resolved) whose result in `results` (the same tree, plain) holds `${` to that
    result escaped (`escape_interpolations`)."""
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, DictConfig) and isinstance(results, dict) and not node._is_none():
        names: Any = [name for name in node.keys() if name in results]
    elif isinstance(node, ListConfig) and isinstance(results, list) and not node._is_none():
        names = range(min(len(node), len(results)))
    else:
        return
    for name in names:
        child, result = node._get_node(name), results[name]
        if isinstance(child, (DictConfig, ListConfig)):
            _escape_literals(child, result)
        elif isinstance(result, str) and "${" in result:
            child._set_value(escape_interpolations(result))


def escape_interpolations(text: str) -> str:
    """`text` as OmegaConf reads back to `text` itself: each `${` escaped as `\\${`, and the backslashes before it
    doubled (`\\\\` is one backslash there). A string without `${` is returned as it is."""
    return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)


def _name_source(exc: ConfigError, files: list[Path] | None, overrides: list[str] | None, merged: Any) -> None:
    """Prefix `exc`'s message with where its field's value came from (the --config file, or `command line` for an
    override), when the loader can tell and the message does not say already (audit56 D8: with several files the
    user could not tell which; audit58 D6: an override's line named no source while a file's did). A rule on the
    schema's default stays as it was. A long string value the message quotes whole is cut (_shorten_value)."""
    from omegaconf import OmegaConf

    key = exc.fields.get("field")
    if isinstance(key, str):
        try:
            value = OmegaConf.select(merged, key, throw_on_resolution_failure=False)
        except Exception:  # a key the config cannot look up (a rule's own name): nothing to cut
            value = None
        if isinstance(value, str):
            exc.message = _shorten_value(exc.message, value)
            exc.args = (exc.message,)
    if not isinstance(key, str) or exc.fields.get("path"):
        return
    where = _source_of(key, files, overrides)
    if where and not exc.message.startswith(where):
        exc.message = f"{where}: {exc.message}"
        exc.args = (exc.message,)


def _shorten_value(message: str, value: object) -> str:
    """`message` with the field's own value, where the rule quoted it whole (repr), cut as config_fields.shown
    cuts it: a section's rule (`__post_init__`) formats its value itself (audit60 D8). Only that value's exact
    text is replaced, so prose and other quotes stay as written (review S3)."""
    whole = repr(value)
    short = shown(value)
    return message.replace(whole, short) if short != whole else message


ALLOWS_NONFINITE = "allows_nonfinite"
"""Field metadata key: True on a float field that may be nan or inf (`field(default=..., metadata={ALLOWS_NONFINITE:
True})`); every other float field of a run config refuses them."""


def _refuse_nonfinite(config: Any, schema: type, files: list[Path] | None, overrides: list[str] | None) -> None:
    """ConfigError (exit 4) naming the first float value (a field, or an item of a list/tuple/dict of floats) that
    is nan or +-inf (`.nan`, `.inf`, `nan`, `1e400`) in a field not declaring ALLOWS_NONFINITE: no rule of a
    component is written for them, and a nan compares false with every bound (audit52)."""
    import math

    for key, value in _floats(config, ""):
        if not math.isfinite(value):
            where = _source_of(key, files, overrides)
            raise ConfigError(
                f"{f'{where}: ' if where else ''}config key `{key}` is {value!r}: a run config takes finite numbers",
                field=key,
                hint=f"set {key} to a finite number (docs/config.md)",
            )


def _refuse_misfit_section_interpolations(merged: Any, files: list[Path] | None, overrides: list[str] | None) -> None:
    """ConfigError (exit 4) naming the first section (a field typed by a config dataclass) whose value is a ${...}
    that does not give a section of its type (`value.model=${policy.model}`, a PolicyConfig; `inner=${maybe_inner}`,
    null), and where that value came from. OmegaConf's own error names no key (audit58 D3: `config: field '' is not
    Optional`). A ${...} giving a section of the section's own type is left alone: it works."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import InterpolationValidationError

    for key, parent, name in _interpolated_sections(merged, ""):
        try:
            parent[name]
        except InterpolationValidationError:
            node = parent._get_node(name)
            text = str(node._value())
            kind = _type_name(node._metadata.ref_type)
            target = re.fullmatch(r"\$\{([\w.]+)\}", text)
            given = OmegaConf.select(merged, target.group(1), default=None) if target else None
            what = "null" if target and given is None else ""
            if given is not None:  # the type it gives (a PolicyConfig for a ValueConfig section)
                name_of = _type_name(OmegaConf.get_type(given))
                what = f"{'an' if name_of[:1] in 'AEIOU' else 'a'} {name_of}"
            where = _source_of(key, files, overrides)
            first = next(iter(node._metadata.ref_type.__dataclass_fields__), "")
            example = f"${{{target.group(1)}.{first}}}" if isinstance(given, DictConfig) and first in given else "..."
            raise ConfigError(
                f"{where + ': ' if where else ''}config key `{key}` (a section of type {kind}) is {text}"
                f"{', which is ' + what if what else ''}: a section cannot be set from another section's "
                "interpolation; set its fields",
                field=key,
                hint=f"set each field, e.g. {key}.{first}={example}",
            ) from None
        except Exception:
            continue  # another error of the ${...} (a missing key): the resolve below names it


def _misfit_tuple_interpolation(
    merged: Any, files: list[Path] | None, overrides: list[str] | None
) -> ConfigError | None:
    """The first tuple field whose ${...} gives no list of its length and item types (`betas=${policy.modes}`), as a
    ConfigError naming the key and where it was set: OmegaConf's own error names no key (audit60 D3: `config:
    TupleConfig length 3 does not match type hint length 2`; review61 3, 4: an item of another type, a scalar for a
    tuple[int, ...]). None when every such ${...} fits (the error was another)."""
    from omegaconf import ListConfig, OmegaConf

    tuples = _interpolated_tuples(merged, "")
    if not tuples:
        return None
    untyped = OmegaConf.create(OmegaConf.to_container(merged, resolve=False))
    for key, node in tuples:
        length, types, _ = _tuple_form(node)
        try:
            value = OmegaConf.select(untyped, key, throw_on_missing=False)
            # another tuple's ${...} is a tuple node there (not a ListConfig): "which is [a]: it takes a list" (audit63)
            listed = isinstance(value, ListConfig) or _is_tuple(value)
            items = list(OmegaConf.to_container(value, resolve=True)) if listed else None
        except Exception:
            continue  # a broken ${...}: the error the caller has names it
        bad = None if items is None else _bad_item(types, items)
        if items is not None and (length is None or len(items) == length) and bad is None:
            continue
        takes = f"{length} values" if length else "a list"
        wanted = f"a list of {takes}" if length else takes
        if items is None:
            what = _flow(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
        elif bad is None or (length is not None and len(items) != length):
            what = f"a list of {len(items)} value{'s' * (len(items) != 1)}"
        else:  # the right shape, an item of another type (review61b 3: "it takes 2 values" of a 2-item list)
            suffix, item, name, kind = bad
            label = suffix[1:-1] if suffix.count("[") == 1 else suffix  # `1`, or `[0][1]` in a nested tuple
            what = f"a list whose item {label} is {_flow(item)}"
            one = len(set(types)) == 1
            takes = f"{name} items" if one else f"{kind} as item {label}"
            wanted = f"a list {'of' if one else 'with'} {takes}"
        letters = ", ".join("abcdefgh"[: length or 2])
        where = _source_of(key, files, overrides)
        return ConfigError(
            f"{where + ': ' if where else ''}config key `{key}` is {node._value()}, which is {what}: it takes {takes}",
            field=key,
            hint=f"point {key} at {wanted}, or write them: {key}=[{letters}] (docs/config.md)",
        )
    return None


def _tuple_item_error(src: str, key: str, bad: tuple[str, Any, str, str], example: str) -> ConfigError:
    """The ConfigError for tuple `key`'s item that does not fit (`bad`, from `_bad_item`): `src` (`FILE: `,
    `command line: ` or ''), the item's key (`betas[1]`, `nest[0][1]`), its value and what it takes."""
    suffix, item, name, takes = bad
    quote = ""
    if name == "Path" and isinstance(item, (bool, int, float)):  # YAML read it as a number or true/false
        quote = f"; quote a path that reads as a number or true/false: '{_flow(item)}'"
    return ConfigError(
        f"{src}config key `{key}{suffix}` is {_flow(item)}: it takes {takes}",
        field=f"{key}{suffix}",
        hint=f"write it as {key}={example} with your values{quote} (docs/config.md)",
    )


def _misfit_tuple_items(
    merged: Any, base: Any, files: list[Path] | None, overrides: list[str] | None, within: str | None
) -> ConfigError | None:
    """The first item of a tuple field of `merged` (not a ${...}) that does not fit its type, as a ConfigError naming
    the item's key (`value.train.betas[1]`, `nest[0][1]`) and where it was set; `within` (a key omegaconf's error
    named) limits the search to the tuples at, above or under it. omegaconf's merge keeps a list or a mapping given
    as an item (`betas=[0.9, {a: 1}]`, `nest=[[1, x], 3]`), and the load then failed naming no key or the item
    (review61b 4, 6: `'<=' not supported between instances of 'int' and 'dict'`, `TupleConfig length 3 does not
    match type hint length 2`). Only called when the load has failed: it changes the message, not what loads.
    `base` (the schema's defaults) gives the hint's example. None when every item fits (the error was another)."""
    from omegaconf import OmegaConf

    for key, node in _tuple_nodes(merged, ""):
        if node._is_interpolation() or node._is_none() or node._is_missing():
            continue
        mine, theirs = _dotted(key), _dotted(within or key)
        # the tuple, one under the key, the key under it, or the key relative to a list's item (`pair` for
        # `inners[0].pair`: a rebuilt item's error names its own key)
        if not (mine == theirs or mine.startswith(theirs + ".") or theirs.startswith(mine + ".")):
            if not mine.endswith("." + theirs):
                continue
        length, types, _ = _tuple_form(node)
        try:
            items = list(OmegaConf.to_container(node, resolve=False))
        except Exception:
            continue
        bad = _bad_item(types, items) if length is None or len(items) == length else None
        if bad is None:
            continue
        try:
            default = OmegaConf.select(base, key, throw_on_missing=False)
        except Exception:
            default = None
        own = _is_tuple(default) and not (default._is_none() or default._is_missing() or default._is_interpolation())
        example = _tuple_form(default)[2] if own else f"[{', '.join('abcdefgh'[: length or 2])}]"
        where = _source_of(f"{key}{bad[0]}", files, overrides)
        return _tuple_item_error(f"{where}: " if where else "", key, bad, example)
    return None


def _tuple_form(node: Any) -> tuple[int | None, tuple[Any, ...], str]:
    """(length, None when variable: tuple[int, ...]; item types, one for a variable tuple; an example value, its own
    when it has one) of a tuple field's node, null (an Optional tuple) or not."""
    import typing

    args = typing.get_args(node._metadata.ref_type)
    variable = not args or Ellipsis in args
    length = None if variable else len(args)
    types = tuple(a for a in args if a is not Ellipsis)
    own = not (node._is_none() or node._is_missing() or node._is_interpolation())
    values = [_example(v) for v in node] if own else list("abcdefgh"[: length or 2])
    return length, types, f"[{', '.join(values)}]"


def _example(value: Any) -> str:
    """A tuple item as a config file writes it: an Enum by name, a path as text, a tuple as a list (review61b 2: the
    hints showed `<Color.RED: 1>`, `PosixPath('/a')`, `(1, 2)`, which do not paste)."""

    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):  # a nested tuple's own node
        value = OmegaConf.to_container(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (tuple, list)):
        return f"[{', '.join(map(_example, value))}]"
    return _flow(value)


def _bad_item(types: tuple[Any, ...], items: list[Any]) -> tuple[str, Any, str, str] | None:
    """(key suffix of the first item omegaconf would not convert to its tuple item type: `[1]`, or `[0][1]` inside a
    nested tuple; the item; the type's name; what the item takes, in words) else None. The types looked at are int,
    float, str, bool, an Enum and a Path (none of which takes null), a nested tuple (a list of its length whose
    items are looked at the same way) and an Optional[...] of one of them (null, or an item of that type); other
    types (Any, a Union of several) and ${...} items are left to omegaconf."""
    for index, item in enumerate(items):
        kind = types[index] if len(types) > 1 and index < len(types) else types[0] if types else None
        found = _item_misfit(kind, item)
        if found is not None:
            suffix, value, name, takes = found
            return f"[{index}]{suffix}", value, name, takes
    return None


def _item_misfit(kind: Any, item: Any) -> tuple[str, Any, str, str] | None:
    """`_bad_item` for one item of type `kind`: (key suffix below the item, the value, the type's name, what it takes)
    when omegaconf refuses `item` for `kind`, else None (also for a type it does not look at). A container given
    for a value omegaconf's merge keeps as it is, and refuses when the config loads (review61b 4, 6)."""
    import typing

    from omegaconf import BooleanNode, EnumNode, FloatNode, IntegerNode, PathNode, StringNode
    from omegaconf.errors import ValidationError

    if kind is None or (isinstance(item, str) and "${" in item):
        return None
    inner = _optional_of(kind)
    if inner is not None:  # Optional[X]: null fits; anything else is X's (audit63: omegaconf's keyless line)
        found = None if item is None else _item_misfit(inner, item)
        if found is None:
            return None
        suffix, value, name, takes = found
        return suffix, value, name, f"{takes} or null" if not suffix else takes  # null fits the item, not below it
    if typing.get_origin(kind) is tuple:  # a nested tuple: a list of its length, each item of its type
        args = typing.get_args(kind)
        length = None if not args or Ellipsis in args else len(args)
        takes = f"a list of {length} values" if length else "a list"
        if not isinstance(item, (list, tuple)) or (length is not None and len(item) != length):
            return "", item, _type_name(kind), takes
        return _bad_item(tuple(a for a in args if a is not Ellipsis), list(item))
    nodes = {int: IntegerNode, float: FloatNode, str: StringNode, bool: BooleanNode}
    is_enum = isinstance(kind, type) and issubclass(kind, enum.Enum)
    is_path = isinstance(kind, type) and issubclass(kind, Path)
    if not (kind in nodes or is_enum or is_path):
        return None  # Any, a Union of several types, a list or a mapping: left to omegaconf
    name = _type_name(kind)
    takes = "a path (a string)" if is_path else name
    if item is None:
        return "", item, name, takes
    try:
        if is_enum:
            EnumNode(enum_type=kind, value=item)
        elif is_path:
            PathNode(value=item)
        else:
            nodes[kind](value=item)
    except ValidationError:
        return "", item, name, takes
    return None


def _optional_of(kind: Any) -> Any:
    """X for `Optional[X]` (`X | None`), else None."""
    import types
    import typing

    if typing.get_origin(kind) not in (typing.Union, types.UnionType):
        return None
    args = typing.get_args(kind)
    rest = [a for a in args if a is not type(None)]
    return rest[0] if len(args) == 2 and len(rest) == 1 else None


def _interpolated_tuples(node: Any, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, node) of each tuple field under `node` whose value is a ${...}."""
    return [(key, child) for key, child in _tuple_nodes(node, prefix) if child._is_interpolation()]


def _tuple_nodes(node: Any, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, node) of each tuple field under `node` (list items as key[i]), not below a ${...}."""
    from omegaconf import DictConfig, ListConfig

    out: list[tuple[str, Any]] = []
    names = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for name in names:
        child = node._get_node(name)
        key = f"{prefix}[{name}]" if isinstance(node, ListConfig) else f"{prefix}.{name}" if prefix else str(name)
        if _is_tuple(child):
            out.append((key, child))
        elif isinstance(child, (DictConfig, ListConfig)) and not child._is_none() and not child._is_missing():
            if not child._is_interpolation():
                out += _tuple_nodes(child, key)
    return out


def _interpolated_sections(node: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """(dotted key, parent, name) of each section under `node` whose value is a ${...}, outermost first."""
    import dataclasses as dc

    from omegaconf import DictConfig, ListConfig

    out: list[tuple[str, Any, Any]] = []
    names = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for name in names:
        child = node._get_node(name)
        key = f"{prefix}[{name}]" if isinstance(node, ListConfig) else f"{prefix}.{name}" if prefix else str(name)
        if not isinstance(child, (DictConfig, ListConfig)) or child._is_none() or child._is_missing():
            continue
        if child._is_interpolation():  # a list's or a mapping's ${...} works (or its resolve names the key)
            if isinstance(child, DictConfig) and dc.is_dataclass(child._metadata.ref_type):
                out.append((key, node, name))
        else:
            out += _interpolated_sections(child, key)
    return out


def _floats(node: Any, prefix: str) -> list[tuple[str, float]]:
    """(dotted key, value) of every float in a config dataclass instance, skipping fields that allow non-finite."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        out = []
        for f in dataclasses.fields(node):
            if f.metadata.get(ALLOWS_NONFINITE):
                continue
            out += _floats(getattr(node, f.name, None), f"{prefix}.{f.name}" if prefix else f.name)
        return out
    if isinstance(node, dict):
        return [kv for k, v in node.items() for kv in _floats(v, f"{prefix}.{k}")]
    if isinstance(node, (list, tuple)):
        return [kv for i, v in enumerate(node) for kv in _floats(v, f"{prefix}[{i}]")]
    return [(prefix, node)] if isinstance(node, float) else []


PLACEHOLDERS = {"BUNDLE": "the bundle folder: portable run BUNDLE ...", "RUN": "the run folder: --output DIR"}
"""The placeholders a schema may declare, and what fills them."""


def _refuse_empty_placeholders(merged: Any, files: list[Path] | None, overrides: list[str] | None) -> None:
    """ConfigError (exit 4) naming the first key whose value uses ${BUNDLE} (or ${RUN}) while that placeholder is
    empty: the schema declares it, nothing filled it (no bundle given, no BUNDLE= set), so `${BUNDLE}/data` would
    silently be `/data` (audit50 F10)."""
    import re

    from omegaconf import OmegaConf

    empty = [n for n in PLACEHOLDERS if n in merged and not OmegaConf.is_missing(merged, n) and merged[n] == ""]
    if not empty:
        return
    plain = OmegaConf.to_container(merged, resolve=False)
    for key, value in _strings(plain, ""):
        for name in empty:
            # after an even run of backslashes (or none) only: `\${RUN}` is the literal text, not the placeholder
            if key != name and re.search(r"(?<!\\)(?:\\\\)*\$\{\s*" + name + r"\s*\}", value):
                where = _source_of(key.split("[")[0], files, overrides)  # a list's file: the list's
                raise ConfigError(
                    f"{f'{where}: ' if where else ''}config key `{key}` uses ${{{name}}}, which is empty here "
                    f"({value!r} would start at /)",
                    field=key,
                    hint=f"give {PLACEHOLDERS[name]} (or the override {name}=PATH after the command; the "
                    f"environment variable {name} is not read), or write {key} without ${{{name}}}",
                )


def _strings(node: Any, prefix: str) -> list[tuple[str, str]]:
    """(dotted key, value) of every string in a plain config (list items as key[i])."""
    if isinstance(node, dict):
        return [kv for k, v in node.items() for kv in _strings(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(node, list):
        return [kv for i, v in enumerate(node) for kv in _strings(v, f"{prefix}[{i}]")]
    return [(prefix, node)] if isinstance(node, str) else []


def _is_interpolation(exc: BaseException) -> bool:
    return "Interpolation" in type(exc).__name__


def _source_of(key: str | None, files: list[Path] | None, overrides: list[str] | None) -> str | None:
    """Where the value of `key` came from: 'command line' (an override sets it), else the last --config file that
    sets it (its path), else None (the schema's default). An unreadable file is skipped (it was read before)."""
    from omegaconf import OmegaConf

    if not key:
        return None
    given = [item.partition("=")[0].strip() for item in overrides or []]
    given += [re.sub(r"\[\d+\]", "[]", k) for k in given]  # a rule names a list item's field `datasets[].path`
    dotted = _dotted(key)
    if any(
        key.startswith((k + ".", k + "["))
        or _dotted(k) == dotted
        or _item_of(_dotted(k), dotted)
        or _dotted(k).startswith(dotted + ".")  # a key under this one (`cameras.a.b=x` into str `cameras.a`: D3)
        for k in given
    ):
        return "command line"  # the key itself, an item of the container the override set, or a key under it
    key = key.split("[")[0]  # a list item's file: the list's
    for path in reversed(files or []):
        try:
            node: Any = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except Exception:
            continue
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            return str(path)
    return None


_ABSENT = object()


def _item_of(dotted: str, container: str) -> bool:
    """`value.train.betas.0` (or an item's field, `datasets.1.path`) sets an item of `value.train.betas` / `datasets`:
    a rule on the whole list or tuple then names the command line (review59 T4). A field of a section is not an item."""
    rest = dotted.removeprefix(container + ".")
    return rest != dotted and rest.split(".")[0].isdigit()


def _dotted(key: str) -> str:
    """`datasets[0].path` as `datasets.0.path` (the two forms of one key)."""
    return key.replace("[", ".").replace("]", "")


def _check_component_sections(node: Any, prefix: str = "", checks: dict[type, Any] | None = None) -> None:
    """The component's rules on every section typed by a component config (RECAP's `value.train` and
    `policy.train`: TrainConfig; `value.model`: ValueConfig; `policy.model`: PolicyConfig; `advantages`:
    AdvantageConfig) with the section's dotted key, so `policy.train.max_steps=0` is not a bare `max_steps` (which
    cannot say which training section is wrong). A recipe's own sections (RECAP's returns, value.infer, eval) pass
    their key to the rules in their __post_init__. Values that do not convert are left to to_object, which names
    their key."""
    from types import SimpleNamespace

    from omegaconf import DictConfig, OmegaConf

    checks = checks or {}
    for name in node.keys():
        child = None if OmegaConf.is_missing(node, name) else node[name]
        if not isinstance(child, DictConfig):  # a value, a list, None or ??? (to_object reports those)
            continue
        key = f"{prefix}.{name}" if prefix else str(name)
        check = checks.get(OmegaConf.get_type(child))
        if check is not None:
            try:
                # resolved already; resolve=True gives a kept `\${...}` as the literal the config loads
                values = OmegaConf.to_container(child, resolve=True, throw_on_missing=True)
            except Exception:
                continue
            check(SimpleNamespace(**values), key=key)
        else:
            _check_component_sections(child, key, checks)


def merged_config(
    files: list[Path] | None,
    overrides: list[str] | None,
    *,
    bundle: Path | None,
    run_dir: Path | None,
    schema: type,
) -> Any:
    """The merged OmegaConf node (unresolved): schema defaults <- files <- overrides <- BUNDLE/RUN. ConfigError (exit
    4) when the schema has a field of a type OmegaConf cannot hold (a set, a class that is no dataclass), naming the
    recipe the config names, the field and its type (audit50 F5: it was "internal error", exit 1)."""
    from omegaconf import OmegaConf

    _refuse_tuples_of_sections(schema, files, overrides)
    try:
        base = OmegaConf.structured(schema)
    except Exception as exc:  # omegaconf's ValidationError: the schema (a recipe's), not the user's config
        raise _schema_error(exc, schema, given_recipe(files, overrides)) from None
    layers = []
    for path in files or []:
        layers.append((str(path), _load_yaml(Path(path))))
    for item in overrides or []:
        key = item.partition("=")[0]
        if "=" not in item or not key or "" in key.split("."):  # `=3`, `.value=3`: no key to name (audit47 F14)
            raise ConfigError(
                f"override {shown(item)} is not key.path=value", field=item, hint="write overrides as key.path=value"
            )
        if key != key.strip():  # ' rl.steps=4' (a quoted shell word): omegaconf read the key ` rl` (audit56 D4)
            raise ConfigError(
                f"override {shown(item)} has spaces around its key {shown(key)}",
                field=key.strip(),
                hint=f"write it without them: {key.strip()}={item.partition('=')[2]}",
            )
    for item in overrides or []:  # each value parses, before anything is merged (one by one: `datasets[0].path=`
        try:  # and `datasets=[...]` are two shapes of one key, which a single dotlist cannot hold)
            OmegaConf.from_dotlist([item])
        except Exception as exc:
            raise _override_error([item], exc) from None
    fields = {f.name for f in dataclasses.fields(schema)}
    places = {}  # only into fields the schema declares: an out-of-tree recipe's config need not offer ${RUN}
    if bundle is not None and "BUNDLE" in fields:
        places["BUNDLE"] = str(Path(bundle).resolve())
    if run_dir is not None and "RUN" in fields:
        places["RUN"] = str(Path(run_dir).resolve())
    for item in overrides or []:  # `RUN=/tmp/x` was silently replaced by --output's folder (audit56 D8)
        key = item.partition("=")[0].strip()
        if key in places:
            raise ConfigError(
                f"override {shown(item)}: {key} is {PLACEHOLDERS[key].partition(':')[0]}, set by the command itself",
                field=key,
                hint=f"remove the override and give {PLACEHOLDERS[key].partition(': ')[2]}",
            )
    named = RECIPE_KEY in fields
    merged = base
    for where, layer in layers:  # a mapping a file gives replaces the default's and an earlier file's, as a list
        _clear_into(merged, OmegaConf.to_container(layer, resolve=False))  # does (audit58 E2); sections still merge
        merged = _merge(merged, layer, where, named=named, files=files, overrides=overrides)
    plain: list[str] = []
    for item in overrides or []:  # in order: a later override wins over an earlier one, as a dotlist merge does
        if _list_index_key(merged, item.partition("=")[0].strip()) is None:
            if _gives_a_mapping(item):  # it replaces the mapping, so the earlier overrides go in first (a dotlist
                if plain:  # merges `a.b={x: 1}` into an earlier `a.b.y=2`)
                    merged = _merge(
                        merged,
                        OmegaConf.from_dotlist(plain),
                        "command line",
                        named=named,
                        files=files,
                        overrides=overrides,
                    )
                    plain = []
                _clear_mappings(merged, item)
            plain.append(item)
            continue
        if plain:
            merged = _merge(
                merged, OmegaConf.from_dotlist(plain), "command line", named=named, files=files, overrides=overrides
            )
            plain = []
        merged = _set_list_item(merged, item)
    if plain:
        merged = _merge(
            merged, OmegaConf.from_dotlist(plain), "command line", named=named, files=files, overrides=overrides
        )
    return _merge(merged, OmegaConf.create(places), "placeholders", named=named)


def _gives_a_mapping(item: str) -> bool:
    """Whether override `item`'s value is a mapping (`policy.model.cameras={}`, `value.model={cameras: {}}`)."""
    from omegaconf import DictConfig, OmegaConf

    return isinstance(OmegaConf.from_dotlist([f"v={item.partition('=')[2]}"])._get_node("v"), DictConfig)


def _clear_mappings(merged: Any, item: str) -> None:
    """Empty, in place, each mapping of `merged` (a dict field, not a section) that override `item` gives whole,
    so that the merge after it leaves the override's entries only: an OmegaConf merge adds a mapping's entries to
    the file's and the schema's, and `policy.model.cameras={}` did nothing (audit58 E1). A whole list is replaced
    by the merge itself; a section given as a mapping (`value.model={cameras: {}}`) keeps its other fields, its
    mappings named in the value are replaced. A key the schema lacks is left to the merge, which names it."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    key, _, text = item.partition("=")
    node: Any = merged
    for part in _dotted(key.strip()).split("."):
        if isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
            continue
        _fill_none_section(node)  # `maybe_inner.tags={}` under a None section: the merge fills it with its defaults
        if isinstance(node, DictConfig) and not (node._is_none() or node._is_missing() or node._is_interpolation()):
            try:
                node = node._get_node(part, throw_on_missing_key=False)
            except Exception:
                return  # not the schema's key: the merge names it
        else:
            return
    value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]), resolve=False)["v"]
    _clear_into(node, value)


def _clear_into(node: Any, value: Any) -> None:
    """`_clear_mappings` below one node: empty it when it is a mapping `value` replaces, else recurse into the
    section's keys `value` gives as mappings. Also a --config file's layer (`value` its plain dicts) before it is
    merged: a file's `cameras: {left_wrist_0_rgb: ...}` kept the default's `base_0_rgb` too (audit58 E2)."""
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig) or not isinstance(value, dict):
        return
    _fill_none_section(node)  # a None section given a mapping: its mappings are replaced too (audit58 D2)
    if node._is_none():
        return
    if not dataclasses.is_dataclass(node._metadata.object_type or node._metadata.ref_type):
        node._set_value({})  # keeps the node's declared type (dict[str, str]): the merge still checks each item
        return
    if node._is_missing() or node._is_interpolation():
        return  # a section the merge fills whole
    for name, given in value.items():
        try:
            child = node._get_node(name, throw_on_missing_key=False)
        except Exception:
            continue  # not the section's key: the merge names it
        _clear_into(child, given)


def _clear_any(node: Any, value: Any) -> None:
    """Set to null, in place, each untyped (Any) field of `node` that `value` (a layer as plain dicts) gives a value
    the merge cannot put over the one it holds: a list over a mapping ("is a section, not a value"), anything over a
    ${...} (the merge resolved it and typed the field as its target: `Cannot assign int to Dict[str, Model]`, and
    merged a mapping into the target's entries: audit58 review S3), a mapping over a list. An Any field takes any
    value, given whole (audit59 B2)."""
    from omegaconf import AnyNode, DictConfig, ListConfig

    if not isinstance(node, DictConfig) or not isinstance(value, dict):
        return
    if node._is_none() or node._is_missing() or node._is_interpolation():
        return
    for name, given in value.items():
        try:
            child = node._get_node(name, throw_on_missing_key=False)
        except Exception:
            continue  # not the section's key: the merge names it
        if child is None or given is None:
            continue
        untyped = isinstance(child, AnyNode) or (
            isinstance(child, (DictConfig, ListConfig)) and child._metadata.ref_type is Any
        )
        if untyped and not child._is_none():
            if child._is_interpolation():
                node[name] = None
            elif isinstance(child, DictConfig) and not isinstance(given, dict):
                node[name] = None
            elif isinstance(child, ListConfig) and isinstance(given, dict):
                node[name] = None
            continue
        _clear_any(child, given)


def _fill_none_section(node: Any) -> None:
    """Set, in place, a section (a dataclass field) that is None to its dataclass's defaults, as the merge of a
    mapping under it does, so that `_clear_into` empties the mappings the mapping gives: `maybe_inner={tags: {}}`
    kept `tags`' default entries when `maybe_inner` defaulted to None (audit58 D2)."""
    from omegaconf import DictConfig

    if isinstance(node, DictConfig) and node._is_none() and dataclasses.is_dataclass(node._metadata.ref_type):
        node._set_value(node._metadata.ref_type)


def _replace_in_lists(node: Any, value: Any, whole: bool = False) -> None:
    """After a merge of `value` (plain dicts and lists) into `node`: in each list `value` gives whole, each mapping
    (a dict field, not a section) keeps only the entries `value` gives. The merge builds each item of such a list from
    its element dataclass's defaults, so a file's `items: [{meta: {z: 1}}]` kept the default's `meta.k` too, and a
    printed `meta: {}` read back as the default (audit58 D1); `_clear_into` cannot empty an item not built yet."""
    from omegaconf import DictConfig, ListConfig

    if not isinstance(node, (DictConfig, ListConfig)) or node._is_none() or node._is_missing():
        return
    if node._is_interpolation():
        return  # its target is another key's: not this value's to change
    if isinstance(node, ListConfig):
        if isinstance(value, list):
            for index, given in enumerate(value[: len(node)]):
                _replace_in_lists(node._get_node(index), given, whole=True)
        return
    if not isinstance(value, dict):
        return
    if whole and not dataclasses.is_dataclass(node._metadata.object_type or node._metadata.ref_type):
        for key in [key for key in node.keys() if key not in value]:
            del node[key]
    for name, given in value.items():
        try:
            child = node._get_node(name, throw_on_missing_key=False)
        except Exception:
            continue  # not the section's key: the merge named it already
        _replace_in_lists(child, given, whole)


def _merge(
    merged: Any,
    layer: Any,
    where: str,
    *,
    named: bool,
    files: list[Path] | None = None,
    overrides: list[str] | None = None,
) -> Any:
    """merged <- layer, or a one-line ConfigError naming the key of the layer that does not fit (and `where` it is)."""
    from omegaconf import OmegaConf

    if not named and RECIPE_KEY in layer:  # it named the recipe that brought this schema
        layer.pop(RECIPE_KEY)
    src = f"{where}: " if where != "placeholders" else ""
    _refuse_non_bools(merged, OmegaConf.to_container(layer, resolve=False), "", src)
    _clear_any(merged, OmegaConf.to_container(layer, resolve=False))
    try:
        result = OmegaConf.merge(merged, layer)
    except Exception as exc:
        try:  # the diagnosis reads the layer unresolved: a file's ${BUNDLE} means nothing yet (audit52 W5)
            plain = OmegaConf.to_container(layer, resolve=False)
            found = _misfit(merged, plain, "", src)
            if found is None and getattr(exc, "full_key", None) and "." not in str(exc.full_key):
                found = _unknown_roots(merged, plain, src, files, overrides)
        except ConfigError:
            raise
        except Exception:
            found = None  # the diagnosis failed: omegaconf's own line, below
        if found is not None:
            raise found from None
        raise _config_error(exc, merged, where=where) from None
    _replace_in_lists(result, OmegaConf.to_container(layer, resolve=False))
    return result


def _refuse_non_bools(node: Any, plain: Any, prefix: str, src: str) -> None:
    """ConfigError (exit 4) naming the first key of `plain` (a layer as plain dicts) that gives a bool field of `node`
    anything but true, false or null: omegaconf turns 2, 0.5 and the string "false" into a bool (2 and "false" alike
    into what their truth says), so `value.model.augment=2` would load as true (audit52 W). An interpolation passes."""
    from omegaconf import BooleanNode, DictConfig, ListConfig, OmegaConf

    if not isinstance(node, DictConfig) or not isinstance(plain, dict):
        return
    for key, value in plain.items():
        try:
            child = node._get_node(key, throw_on_missing_key=False)
        except Exception:
            continue  # not the schema's key: the merge names it
        dotted = f"{prefix}{key}"
        if isinstance(child, BooleanNode):
            if value is None or isinstance(value, bool) or (isinstance(value, str) and "${" in value):
                continue
            raise ConfigError(
                f"{src}config key `{dotted}` is {_flow(value)}: it takes true or false",
                field=dotted,
                hint=f"set {dotted}=true or {dotted}=false (docs/config.md)",
            )
        if isinstance(child, DictConfig) and isinstance(value, dict):
            _refuse_non_bools(child, value, f"{dotted}.", src)
        elif isinstance(child, ListConfig) and isinstance(value, list):
            item_type = child._metadata.element_type
            if dataclasses.is_dataclass(item_type):
                item_node = OmegaConf.structured(item_type)
                for i, item in enumerate(value):
                    _refuse_non_bools(item_node, item, f"{dotted}[{i}].", src)


def _refuse_interpolated_non_bools(merged: Any, files: list[Path] | None, overrides: list[str] | None) -> None:
    """ConfigError (exit 4) naming the first bool field whose ${...} resolves to anything but a bool, null or the
    words true/false: omegaconf converts the result as it converts a literal, so `value.model.augment=${eval.seed}`
    loaded as true (stop 53's left-over; a literal is refused by _refuse_non_bools). The results are read from an
    untyped copy, where no bool node converts them; an interpolation that fails to resolve is left to the loader."""
    from omegaconf import OmegaConf

    keys = _interpolated_bool_keys(merged, "")
    if not keys:
        return
    untyped = OmegaConf.create(OmegaConf.to_container(merged, resolve=False))
    for key in keys:
        try:
            value = OmegaConf.select(untyped, key, throw_on_missing=False)
        except Exception:
            continue  # a broken interpolation: the loader's resolve names it
        if value is None or isinstance(value, bool) or (isinstance(value, str) and value.lower() in ("true", "false")):
            continue
        where = _source_of(key, files, overrides)
        raw = _raw_value(merged, key)
        raise ConfigError(
            f"{f'{where}: ' if where else ''}config key `{key}` is {raw}, which is {_flow(value)}: it takes true or "
            "false",
            field=key,
            hint=f"point {key} at a true/false value or set {key}=true or {key}=false (docs/config.md)",
        )


def _interpolated_bool_keys(node: Any, prefix: str) -> list[str]:
    """Dotted keys (list items as key[i]) of the bool nodes under `node` whose value is a ${...} interpolation."""
    from omegaconf import BooleanNode, DictConfig, ListConfig

    out: list[str] = []
    if isinstance(node, DictConfig):
        if node._is_none() or node._is_missing() or node._is_interpolation():
            return out
        for key in node.keys():
            child = node._get_node(key)
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(child, BooleanNode):
                if child._is_interpolation():
                    out.append(dotted)
            else:
                out += _interpolated_bool_keys(child, dotted)
    elif isinstance(node, ListConfig):
        if node._is_none() or node._is_missing() or node._is_interpolation():
            return out
        for i in range(len(node)):
            child = node._get_node(i)
            dotted = f"{prefix}[{i}]"
            if isinstance(child, BooleanNode):
                if child._is_interpolation():
                    out.append(dotted)
            else:
                out += _interpolated_bool_keys(child, dotted)
    return out


def _raw_value(merged: Any, key: str) -> str:
    """The unresolved text of `key`'s node (its ${...})."""
    node: Any = merged
    for part in key.replace("[", ".").replace("]", "").split("."):
        node = node._get_node(int(part) if part.isdigit() and not hasattr(node, "keys") else part)
    return str(node._value())


def _misfit(merged: Any, plain: Any, prefix: str, src: str) -> ConfigError | None:
    """The first key of `plain` (a layer as plain dicts) whose value's shape does not fit the node of `merged` it
    merges into: a section or mapping given a value, a list given a mapping, a fixed-length tuple given another
    length. omegaconf's merge error names no key for these ("Cannot merge incompatible container types")."""
    from omegaconf import DictConfig, ListConfig

    if not isinstance(plain, dict) or not isinstance(merged, DictConfig):
        return None
    for key, theirs in plain.items():
        try:
            mine = merged._get_node(key, throw_on_missing_key=False)
        except Exception:
            mine = None
        dotted = f"{prefix}{key}"
        if isinstance(mine, DictConfig) and theirs is not None and not isinstance(theirs, dict):
            return ConfigError(
                f"{src}config key `{dotted}` is a section, not a value",
                field=dotted,
                hint=f"set its fields ({dotted}.NAME=...; docs/config.md lists them)",
            )
        if _is_tuple(mine) and theirs is not None and not isinstance(theirs, list) and "${" not in str(theirs):
            # omegaconf 2.4's TupleConfig is no ListConfig: its merge said "Cannot merge incompatible container
            # types" naming no key, or "int is not a TupleConfig, ..." (audit60 D3)
            length, _, example = _tuple_form(mine)
            item = "" if mine._is_none() else f", or set one item as {dotted}[0]=..."  # a null one has no items
            return ConfigError(
                f"{src}config key `{dotted}` takes {f'{length} values' if length else 'values'} as a list, e.g. "
                f"{example}, not {_flow(theirs)}",
                field=dotted,
                hint=f"write it as {dotted}={example} with your values{item} (docs/config.md)",
            )
        if isinstance(mine, ListConfig) and isinstance(theirs, dict):
            sections = dataclasses.is_dataclass(getattr(mine._metadata, "element_type", None))
            whole, item = ("[{NAME: ...}, ...]", "[0].NAME") if sections else ("[a, b]", "[0]")
            return ConfigError(
                f"{src}config key `{dotted}` is a list, not a mapping: {_flow(theirs)}",
                field=dotted,
                hint=f"write the whole list as {dotted}={whole}, or set one item as {dotted}{item}=... "
                "(docs/config.md)",
            )
        if isinstance(mine, ListConfig) and theirs is not None and not isinstance(theirs, (list, dict)):
            # omegaconf's own line was "AnyNode is not a ListConfig, TupleConfig, list, or tuple" (audit56 D6)
            sections = dataclasses.is_dataclass(getattr(mine._metadata, "element_type", None))
            example = "[{NAME: ...}, ...]" if sections else f"[{_flow(theirs)}]"
            return ConfigError(
                f"{src}config key `{dotted}` must be a list, e.g. {example}, not {_flow(theirs)}",
                field=dotted,
                hint=f"write {dotted}={example} (a YAML list: [a, b]; docs/config.md)",
            )
        if _is_tuple(mine) and isinstance(theirs, list):
            length, types, example = _tuple_form(mine)  # a null Optional tuple too (review61 2: its len() raised)
            if length is not None and len(theirs) != length:
                return ConfigError(
                    f"{src}config key `{dotted}` takes {length} values, got {len(theirs)}: {_flow(theirs)}",
                    field=dotted,
                    hint=f"write it as {dotted}={example} with your values",
                )
            bad = _bad_item(types, theirs)
            if bad is not None:  # omegaconf's own line named no key and showed its template: '$VALUE' (review61 3)
                return _tuple_item_error(src, dotted, bad, example)
        if isinstance(mine, DictConfig) and isinstance(theirs, dict):
            found = _misfit(mine, theirs, f"{dotted}.", src)
            if found is not None:
                return found
        if isinstance(mine, ListConfig) and isinstance(theirs, list):
            found = _misfit_items(getattr(mine._metadata, "element_type", None), enumerate(theirs), dotted, src, "[{}]")
            if found is not None:
                return found
        if isinstance(mine, DictConfig) and isinstance(theirs, dict) and not _is_section(mine):
            entries = [(k, v) for k, v in theirs.items()]  # a dict[str, Section]'s entries, new ones included
            found = _misfit_items(getattr(mine._metadata, "element_type", None), entries, dotted, src, ".{}")
            if found is not None:
                return found
    return None


def _is_section(node: Any) -> bool:
    return dataclasses.is_dataclass(node._metadata.object_type or node._metadata.ref_type)


def _misfit_items(element: Any, items: Any, dotted: str, src: str, form: str) -> ConfigError | None:
    """The first field of an item of a list (or mapping) of sections, given whole, that does not fit the section:
    omegaconf's merge error names only the field's leaf (`bad`, not `prep.items[0].bad`), and the unknown-key hint
    listed the top-level keys (audit59 B1). Each item is merged alone into its section's defaults and the error
    named with the item's full key (`form` makes `[0]` or `.NAME`)."""
    from omegaconf import OmegaConf

    if not dataclasses.is_dataclass(element):
        return None
    for index, item in items:
        if not isinstance(item, dict):
            continue
        key = f"{dotted}{form.format(index)}"
        section = OmegaConf.structured(element)
        found = _misfit(section, item, f"{key}.", src)
        if found is not None:
            return found
        try:
            OmegaConf.merge(section, item)
        except Exception as exc:
            return _config_error(exc, section, where=src.removesuffix(": ") or None, prefix=f"{key}.")
    return None


def _unknown_roots(
    merged: Any, plain: Any, src: str, files: list[Path] | None, overrides: list[str] | None
) -> ConfigError | None:
    """When a layer's top-level keys are not the schema's: one error naming them all and the recipe (a config
    written for another recipe: `recipe=grpo` with RECAP's file, audit52 W5)."""
    valid = _keys_at(merged, "")
    unknown = [" ".join(str(k).split()) for k in plain if str(k) not in valid] if isinstance(plain, dict) else []
    if not unknown:
        return None
    try:
        recipe = given_recipe(files, overrides) or DEFAULT_RECIPE
    except Exception:
        recipe = None
    names = ", ".join(f"`{k}`" for k in unknown)
    hint = (
        "a config written for another recipe: run it with that recipe (recipe: NAME in the file, or recipe=NAME)"
        if len(unknown) > 1
        else None
    )
    near = difflib.get_close_matches(unknown[0], valid, n=1, cutoff=0.5)
    hint = hint or (f"did you mean `{near[0]}`?" if near else f"valid keys here: {', '.join(valid)}")
    hint = HYDRA_HINT if unknown[0].startswith("+") else hint
    who = f" for recipe {recipe!r}" if recipe else ""
    return ConfigError(
        f"{src}unknown config key{'s' if len(unknown) > 1 else ''} {names}{who}", field=unknown[0], hint=hint
    )


HYDRA_HINT = (
    "Hydra's +key=value (add) and ~key (delete) overrides are not supported: every key exists already, so write "
    "key=value; leave a key out for its default, or write key=null where it may be null (docs/config.md)"
)


def _flow(value: Any) -> str:
    """A plain value as one line of YAML flow style ({a: 1}, [0.9]) for a message: past SHOWN_VALUE_CHARS, its start
    and `... (N chars)` (review60 T3: a 100 KB bool given made a 100 KB error line)."""
    import yaml

    try:
        text = " ".join(yaml.safe_dump(value, default_flow_style=True, width=10**6).split()).removesuffix(" ...")
    except Exception:
        text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else f"{text[:SHOWN_VALUE_CHARS]}... ({len(text)} chars)"


def _list_index_key(merged: Any, key: str) -> tuple[str, int, int] | None:
    """(dotted key of the list, index, its length) when override key `key` indexes a list of `merged`
    (`datasets[0].path`, `datasets.0.path`); None when it goes through mappings only."""
    from omegaconf import DictConfig, ListConfig

    node = merged
    parts = _dotted(key).split(".")
    for i, part in enumerate(parts):
        if isinstance(node, ListConfig) or _is_tuple(node):
            try:
                index = int(part)
            except ValueError:
                return (".".join(parts[:i]), -1, len(node))
            return (".".join(parts[:i]), index, len(node))
        if not isinstance(node, DictConfig):
            return None
        try:
            node = node._get_node(part, throw_on_missing_key=False)
        except Exception:
            return None
    return None


def _set_list_item(merged: Any, item: str) -> Any:
    """merged with override `item` (`datasets[0].path=/x`) set inside an existing list item, typed by the schema;
    a ConfigError naming the key when the index is not one of the list's or the value does not fit."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    key, _, text = item.partition("=")
    key = key.strip()
    found = _list_index_key(merged, key)
    assert found is not None
    listed, index, length = found
    if not 0 <= index < length:
        shown = f"{listed}[0]" + (f"..{listed}[{length - 1}]" if length > 1 else "")
        raise ConfigError(
            f"command line: config key `{key}`: {listed} has {length} item{'s' if length != 1 else ''}, "
            f"so `{_dotted(key).split('.')[len(listed.split('.'))]}` is not an index of it",
            field=key,
            hint=f"set an item that is there ({shown}), or give the whole list: {listed}=[...]"
            if length
            else f"give the whole list: {listed}=[...]",
        )
    value = OmegaConf.from_dotlist([f"v={text}"])._get_node("v")
    value = value if isinstance(value, (DictConfig, ListConfig)) else value._value()
    tuple_node = OmegaConf.select(merged, listed, throw_on_missing=False)
    if _is_tuple(tuple_node):
        return _set_tuple_item(merged, key, listed, index, tuple_node, value)
    *parents, last = _dotted(key).split(".")
    parent = OmegaConf.select(merged, ".".join(parents), throw_on_missing=False) if parents else merged
    plain = OmegaConf.to_container(value, resolve=False) if isinstance(value, (DictConfig, ListConfig)) else value
    _refuse_non_bools(parent, {last: plain}, key.rpartition(".")[0] + "." if parents else "", "command line: ")
    if isinstance(value, DictConfig):  # a mapping given whole replaces the item's, as at the top level (audit58 E1)
        _clear_mappings(merged, item)
        _clear_any(parent, {last: plain})
    try:
        OmegaConf.update(merged, _dotted(key), value, merge=True)
    except Exception as exc:
        raise _config_error(exc, merged, where="command line") from None
    node: Any = merged  # a list the value gives (`items.0.subs=[...]`) is built from defaults too (audit58 D1)
    for part in _dotted(key).split("."):
        node = node._get_node(int(part) if isinstance(node, ListConfig) else part)
    _replace_in_lists(node, plain)
    return merged


def _is_tuple(node: Any) -> bool:
    """Whether `node` is a fixed-length tuple field (omegaconf's TupleConfig: immutable, set only whole)."""
    return type(node).__name__ == "TupleConfig"


def _set_tuple_item(merged: Any, key: str, listed: str, index: int, node: Any, value: Any) -> Any:
    """merged with item `index` of tuple `listed` set to `value` (`value.train.betas[0]=0.8`), by setting the whole
    tuple with its other items kept: omegaconf's tuple is immutable and its error named no key ("Cannot merge
    incompatible container types", audit59 B3). A ConfigError naming `key` when the key goes below the item or the
    value does not fit the tuple's type."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    items = list(OmegaConf.to_container(node, resolve=False))
    whole = f"{listed}=[{', '.join(_flow(v) for v in items)}]"
    if _dotted(key) != f"{listed}.{index}":
        raise ConfigError(
            f"command line: config key `{key}`: {listed} is a tuple of values, its items have no fields",
            field=key,
            hint=f"set an item ({listed}[{index}]=...) or the whole tuple: {whole} with your values",
        )
    plain = OmegaConf.to_container(value, resolve=False) if isinstance(value, (DictConfig, ListConfig)) else value
    items[index] = plain
    try:
        OmegaConf.update(merged, listed, items, merge=True)
    except Exception:
        raise ConfigError(
            f"command line: config key `{key}`: {_flow(plain)} does not fit {listed}'s type "
            f"{_annotation_name(node._metadata.ref_type)}",
            field=key,
            hint=f"give a value of that type, or the whole tuple: {whole} with your values",
        ) from None
    return merged


SCHEMA_TYPES = (
    "int, float, bool, str, bytes, pathlib.Path, an Enum, Any, Optional[...] of one, list[...] or dict[str, ...] of "
    "those, or a nested @dataclass section"
)
"""The field types a recipe's config schema may use (what OmegaConf's structured configs hold)."""


def _refuse_tuples_of_sections(schema: type, files: list[Path] | None, overrides: list[str] | None) -> None:
    """ConfigError (exit 4) for a schema field typed `tuple[SomeDataclass, ...]`: OmegaConf builds its default but
    refuses any value given for it ("dict is not a subclass of Pt", naming no key), so every --print-config output
    of such a recipe could not be read back (audit60 D2). `list[SomeDataclass]` works; the error says so."""
    import typing

    def members(tp: Any) -> list[Any]:
        """`tp` and every type inside it, at any depth (Optional/Union, list, dict, tuple arguments)."""
        return [tp, *(m for a in typing.get_args(tp) if a is not Ellipsis for m in members(a))]

    def walk(cls: type, prefix: str, seen: tuple[type, ...]) -> None:
        for name, tp in _resolved_types(cls).items():
            key = f"{prefix}{name}"
            # also inside Optional/list/dict: `tuple[Pt, ...] | None` failed the same way (audit60 review S6)
            for inner in members(tp):
                args = [a for a in typing.get_args(inner) if a is not Ellipsis]
                if typing.get_origin(inner) is tuple and any(dataclasses.is_dataclass(a) for a in args):
                    recipe = given_recipe(files, overrides)
                    ref = f"{schema.__module__}:{schema.__qualname__}"
                    item = next(a for a in args if dataclasses.is_dataclass(a)).__qualname__
                    raise ConfigError(
                        f"{f'recipe {recipe!r}: ' if recipe else ''}config_schema {ref}: field `{key}` is of type "
                        f"{_annotation_name(tp)}, a tuple of sections, which a run config cannot set or read back",
                        field=key,
                        hint=f"type the tuple in `{key}` as list[{item}] (a list of sections works like any list)"
                        if inner is not tp
                        else f"type `{key}` as list[{item}] (a list of sections works like any list)",
                    )
            for inner in members(tp):  # sections nested directly, in Optional/list/dict, at any depth
                if isinstance(inner, type) and dataclasses.is_dataclass(inner) and inner not in seen:
                    walk(inner, f"{key}.", (*seen, inner))

    walk(schema, "", (schema,))


def _schema_error(exc: BaseException, schema: type, recipe: str | None) -> ConfigError:
    """The one-line ConfigError for a config schema OmegaConf cannot build: the recipe (as the config names it), the
    field's dotted key and its type annotation, and the types allowed."""
    key = str(getattr(exc, "full_key", None) or "")
    node: Any = schema
    annotation: Any = None
    for part in key.split(".") if key else []:
        hints = _resolved_types(node) if isinstance(node, type) and dataclasses.is_dataclass(node) else {}
        annotation = hints.get(part.split("[")[0])
        node = annotation
    shown = _annotation_name(annotation) if annotation is not None else _first_line(exc)
    ref = f"{schema.__module__}:{schema.__qualname__}"
    who = f"recipe {recipe!r}: " if recipe else ""
    field_part = f"field `{key}` is of type {shown}" if key else f"{shown}"
    return ConfigError(
        f"{who}config_schema {ref}: {field_part}, which a run config cannot hold",
        field=key or "config_schema",
        hint=f"give each field of the schema one of: {SCHEMA_TYPES} (a set as a list; a class of your own as a "
        "@dataclass)",
    )


def _annotation_name(tp: Any) -> str:
    """A type annotation as written (`set`, `Thing`, `list[set]`)."""
    if isinstance(tp, type) and not getattr(tp, "__args__", None):
        return tp.__qualname__
    return str(tp).replace("typing.", "")


def _load_yaml(path: Path) -> Any:
    from omegaconf import DictConfig, OmegaConf

    if path.is_dir():
        raise InputNotFoundError(f"config file {path} is a folder, not a file", path=path, hint="pass a --config FILE")
    if path.exists() and not path.is_file():  # /dev/null, a FIFO: it exists, so "does not exist" misled (audit60 D5)
        raise InputNotFoundError(
            f"config file {path} is not a regular file (a FIFO, a socket or a device)",
            path=path,
            hint="pass a --config FILE (a YAML file; an empty file changes nothing)",
        )
    if not path.is_file():
        raise InputNotFoundError(f"config file {path} does not exist", path=path, hint="pass an existing --config FILE")
    _refuse_big_or_not_utf8(path)
    try:
        node = OmegaConf.load(path)
    except Exception as exc:
        if "Invalid loaded object type" in str(exc):  # valid YAML holding a number or bool (audit60 D5)
            raise ConfigError(
                f"{path}: the top level is not a mapping of keys",
                path=path,
                hint="a run config is `key: value` lines (docs/config.md), e.g. `recipe: recap`",
            ) from None
        where, what = _yaml_problem(exc)
        limit = re.search(r"expansion exceeds the configured limit of (\d+)", str(exc))
        if limit:  # valid YAML, too big: omegaconf's advice to lift its limit is not the user's fix (audit52 W8)
            raise ConfigError(
                f"{path}: too large for a run config: more than {limit.group(1)} YAML nodes (keys and values, "
                "aliases counted as expanded)",
                path=path,
                hint="a run config is small: keep only the keys you change (docs/config.md), and no anchors/aliases "
                "that expand it",
            ) from None
        if not where and _INTERPOLATION in type(exc).__name__:
            key = getattr(exc, "full_key", None)
            raise ConfigError(
                f"{path}: {f'config key `{key}`: ' if key else ''}bad interpolation: {what}",
                path=path,
                field=key,
                hint=INTERPOLATION_HINT,
            ) from None
        raise ConfigError(
            f"{path}{':' + where if where else ''}: not valid YAML: {what}",
            path=path,
            hint="each key once per mapping: merge the two (or remove one)"
            if "duplicate key" in what
            else "fix the YAML syntax there",
        ) from None
    if not isinstance(node, DictConfig) or _holds_a_scalar(path):
        raise ConfigError(
            f"{path}: the top level is not a mapping of keys",
            path=path,
            hint="a run config is `key: value` lines (docs/config.md), e.g. `recipe: recap`",
        )
    return node


CONFIG_FILE_MAX_BYTES = 1_000_000
"""Largest --config file read (1 MB; a run config is a few kB): checked before YAML parses it, as a 50 MB file kept
the parser busy for minutes and a 39 MB list took 1.3 GB before the node limit refused it (audit56 D5)."""


def _refuse_big_or_not_utf8(path: Path) -> None:
    """ConfigError (exit 4) naming `path` when it is over CONFIG_FILE_MAX_BYTES or is not UTF-8 text (with the line
    and byte offset of the first bad byte); a UTF-8 byte-order mark is fine. Read at most the limit plus one byte,
    so a pipe or a huge file is not read whole."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            data = fh.read(CONFIG_FILE_MAX_BYTES + 1)
    except OSError:
        return  # the loader's own open reports it
    if size > CONFIG_FILE_MAX_BYTES or len(data) > CONFIG_FILE_MAX_BYTES:
        raise ConfigError(
            f"{path}: {max(size, len(data)):,} bytes, over the {CONFIG_FILE_MAX_BYTES:,}-byte limit of a run config",
            path=path,
            hint="a run config is small: keep only the keys you change (docs/config.md)",
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text: byte 0x{data[exc.start]:02x} at byte offset {exc.start}",
            path=path,
            hint=f"save the file as UTF-8 (line {line}, byte offset {exc.start} holds 0x{data[exc.start]:02x})",
        ) from None


def _holds_a_scalar(path: Path) -> bool:
    """Whether the YAML document is one string: OmegaConf.load reads `hello` as {hello: None}, which the schema
    then calls an unknown key `hello`."""
    import yaml

    try:
        return isinstance(yaml.safe_load(path.read_text(encoding="utf-8")), str)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False


def _first_line(exc: BaseException) -> str:
    """omegaconf's message on one line; one that quotes a long value (`Value '<100 KB>' could not be converted to
    Float`) keeps its start and its end around `... (N chars) ...` (review60 T3: the type errors printed the whole
    value, which `shown` cuts only where this package quotes it)."""
    line = " ".join(str(exc).split("\n")[0].split())
    if len(line) <= 3 * SHOWN_VALUE_CHARS:
        return line
    return f"{line[:SHOWN_VALUE_CHARS]}... ({len(line)} chars) ...{line[-SHOWN_VALUE_CHARS // 2 :]}"


_INTERPOLATION = "GrammarParseError"
"""omegaconf's error for a malformed ${...} (its class name: omegaconf is imported lazily)."""
INTERPOLATION_HINT = "an interpolation is ${key.path} (or ${BUNDLE}, ${RUN}): check its braces"


def _yaml_problem(exc: BaseException, *, value: str | None = None) -> tuple[str, str]:
    """(where, what) of a YAML syntax error, each one line. In a file (`value` None) `where` is 'LINE:COLUMN' of
    PyYAML's problem; in an override's `value` it is 'column N of the value' (or 'the end of the value'). `what` is
    PyYAML's problem, then what it was parsing and where that starts (its first line alone loses both). An error
    without PyYAML's marks (omegaconf's interpolation grammar): ('', its first line)."""
    import yaml

    if not isinstance(exc, yaml.MarkedYAMLError) or not (exc.problem or exc.context):
        return "", _first_line(exc)

    def at(mark: Any) -> str:
        if value is None:
            return f"line {mark.line + 1}, column {mark.column + 1}"
        if mark.line > 0 or mark.column >= len(value):
            return "the end of the value"
        return f"column {mark.column + 1} of the value"

    problem, context = (" ".join(str(t).split()) for t in (exc.problem or "", exc.context or ""))
    mark, start = (exc.problem_mark, exc.context_mark) if problem else (exc.context_mark, None)
    what = problem or context
    if problem and context:
        same = start is None or mark is None or (start.line, start.column) == (mark.line, mark.column)
        what += f" ({context}{'' if same else ' that starts at ' + at(start)})"
    if mark is None:
        return "", what
    return (f"{mark.line + 1}:{mark.column + 1}" if value is None else at(mark)), what


def _override_error(overrides: list[str], exc: BaseException) -> ConfigError:
    """The one-line error for command-line overrides that do not parse: the first one that fails on its own is named,
    with where in its value and why (an unquoted ${...} inside [...] or {...} hints at quoting)."""
    from omegaconf import OmegaConf

    for item in overrides:
        try:
            OmegaConf.from_dotlist([item])
        except Exception as own:
            exc = own
            break
    else:
        return ConfigError(f"command-line overrides: {_first_line(exc)}", field="overrides")
    value = item.partition("=")[2]
    where, what = _yaml_problem(exc, value=value)
    if not where and _INTERPOLATION in type(exc).__name__:
        return ConfigError(
            f"override {shown(item)}: bad interpolation: {what}", field="overrides", hint=INTERPOLATION_HINT
        )
    if "${" in value and any(c in value for c in "[{"):
        hint = (
            'inside [...] or {...} a value holding ${...} must be quoted: path: "/data/${RUN}" (and the whole '
            "override in single quotes for the shell)"
        )
    else:
        hint = "the value after = is YAML: check its brackets and quotes (quote a string holding `: ` or `,`)"
    return ConfigError(
        f"override {shown(item)}: not valid YAML{' at ' + where if where else ''}: {what}", field="overrides", hint=hint
    )


def _config_error(exc: BaseException, merged: Any, *, where: str | None = None, prefix: str = "") -> ConfigError:
    """An omegaconf error as a one-line ConfigError naming the key (nearest valid name when unknown). `prefix` is the
    key of `merged` when it is one item of a larger config (`prep.items[0].`), put before the key the error names."""
    from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, ValidationError

    relative = " ".join(str(getattr(exc, "full_key", None) or "").split())  # a newline in a key: one line (D9)
    key = f"{prefix}{relative}" if relative else prefix.removesuffix(".")
    src = f"{where}: " if where and where != "placeholders" else ""
    msg = _first_line(exc)
    if isinstance(exc, ConfigKeyError) or "not in" in msg:
        parent, _, leaf = relative.rpartition(".")
        leaf = leaf.split("[")[0]
        valid = _keys_at(merged, parent)
        near = difflib.get_close_matches(leaf, valid, n=1, cutoff=0.5)
        shown = f"{prefix}{parent}." if parent else prefix
        hint = f"did you mean `{shown + near[0]}`?" if near else None
        hint = hint or (f"valid keys here: {', '.join(valid)}" if valid else None)
        hint = HYDRA_HINT if key.startswith("+") else hint
        return ConfigError(f"{src}unknown config key `{key}`", field=key, hint=hint)
    if isinstance(exc, MissingMandatoryValue):
        return ConfigError(f"{src}config key `{key}` has no value", field=key, hint=f"set {key}=... ")
    if isinstance(exc, ValidationError) and key:
        return ConfigError(f"{src}config key `{key}`: {msg}", field=key, hint="see docs/config.md for its type")
    if _is_interpolation(exc) and key:  # name the key holding the ${...} (audit47 F14)
        offered = [f"${{{n}}}" for n in PLACEHOLDERS if n in _keys_at(merged, "")]  # only those the schema has
        names = ", ".join(["a config key (${eval.seed})", *offered[:-1]]) + (f" or {offered[-1]}" if offered else "")
        hint = f"an interpolation names {names}: check the name and braces"
        if "Environment variable" in msg:  # ${oc.env:NAME} with NAME unset (audit60 H19)
            hint = "set that environment variable, give a default (${oc.env:NAME,default}), or write the value itself"
        elif "Unsupported interpolation type" in msg:
            hint = "the resolvers are oc.env, oc.decode, oc.create and oc.select (docs/config.md), or write the value"
        return ConfigError(f"{src}config key `{key}`: {msg}", field=key, hint=hint)
    return ConfigError(  # omegaconf named no key (a shape _misfit does not know): at least say where to look
        f"{src}config: {msg}", field=key or None, hint="docs/config.md lists every key with its type"
    )


def _keys_at(node: Any, dotted: str) -> list[str]:
    from omegaconf import DictConfig, OmegaConf

    try:
        sub = OmegaConf.select(node, dotted) if dotted else node
    except Exception:
        return []
    return sorted(str(k) for k in sub.keys()) if isinstance(sub, DictConfig) else []


def to_yaml(config: Any, recipe: str | None = None) -> str:
    """The resolved config as YAML (what --print-config shows) that `--config` reads back to the same config: plain
    YAML, which yaml.safe_load reads (a Path as its string, an Enum by its name, which the loader takes), starting
    with `recipe: NAME` (the config's own `recipe` field, else `recipe` when given). audit58 B6: an out-of-tree
    recipe's printed config named no recipe (read back as RECAP's: exit 4) and a Path was a python/object tag. A
    string holding `${` (a literal a `\\${...}` gave) is printed escaped, so it reads back as that literal."""
    from omegaconf import OmegaConf

    plain = _plain_scalars(OmegaConf.to_container(OmegaConf.structured(config), enum_to_str=True))
    if RECIPE_KEY in plain or recipe is not None:  # first: given_recipe reads it before the schema is known
        plain = {RECIPE_KEY: plain.pop(RECIPE_KEY, recipe), **plain}
    return OmegaConf.to_yaml(OmegaConf.create(plain))


def _plain_scalars(node: Any) -> Any:
    """`node` (plain dicts, lists and tuples) with each Path as its string (a YAML safe loader reads no Python object)
    and each string holding `${` escaped (`escape_interpolations`: --config would resolve it, audit58 D5). A tuple is
    a list: a tuple field's Paths were printed as `!!python/object/apply:pathlib.PosixPath` (audit62)."""
    if isinstance(node, dict):
        return {key: _plain_scalars(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain_scalars(value) for value in node]
    return escape_interpolations(str(node)) if isinstance(node, (str, Path)) else node


def to_json(config: Any, recipe: str | None = None) -> str:
    """The resolved config as one JSON document (what --print-config --json shows; the same values as to_yaml),
    which `--config` reads back: `recipe` (the recipe's name) comes first when the config has no `recipe` field of
    its own; an out-of-tree recipe's JSON named none and read back as RECAP's, exit 4 (audit58 D4). A config with
    the field keeps its key order. A string holding `${` is escaped as in to_yaml (`\\${`), which --config needs."""
    import json

    from omegaconf import OmegaConf

    plain = _plain_scalars(OmegaConf.to_container(OmegaConf.structured(config), enum_to_str=True))
    if RECIPE_KEY not in plain and recipe is not None:
        plain = {RECIPE_KEY: recipe, **plain}
    return json.dumps(plain, indent=1, default=str) + "\n"


def to_plain(config: Any) -> Any:
    """A dataclass config as plain JSON-able dicts and lists (tuples become lists)."""
    if dataclasses.is_dataclass(config):
        return {f.name: to_plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (list, tuple)):
        return [to_plain(v) for v in config]
    if isinstance(config, dict):
        return {str(k): to_plain(v) for k, v in config.items()}
    return config


def as_recorded(plain: Any) -> Any:
    """`plain` (to_plain's) as a config file writes it, so that run.json's `config` reads back through `--config` to
    the same config: a plain Enum by its name (JSON wrote `Color.BLUE`, which the loader refuses; an int or str Enum
    is written as its value, which it reads, and is left so) and a string or Path holding `${` escaped
    (`escape_interpolations`: recorded as the literal, it was read back as an interpolation). Every other value is
    returned as it is, so a config holding neither records, and keys, the same bytes as before (audit62 B7)."""
    if isinstance(plain, dict):
        return {key: as_recorded(value) for key, value in plain.items()}
    if isinstance(plain, list):
        return [as_recorded(value) for value in plain]
    if isinstance(plain, enum.Enum):
        return plain if isinstance(plain, (int, float, str)) else plain.name
    if isinstance(plain, (str, Path)) and "${" in str(plain):
        return escape_interpolations(str(plain))
    return plain


def select(plain: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """plain[a][b] for "a.b" (`default` when absent)."""
    node: Any = plain
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


# -- the reference doc ----------------------------------------------------------------------------


def field_docs(cls: type) -> dict[str, str]:
    """{field: one-line doc} from the attribute docstrings under each field of dataclass `cls`."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for i, stmt in enumerate(body[:-1]):
            nxt = body[i + 1]
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(getattr(nxt, "value", None), ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def reference(schema: type) -> str:
    """docs/config.md: every key of the run config with its type, default and doc (generated)."""
    lines = [
        "# Run config reference",
        "",
        "Generated from the config dataclasses by `python -m reproduction.run.config > docs/config.md`;",
        "a test fails when this file is out of date. Set keys in a YAML file (`portable run --config FILE`)",
        "or on the command line as `key.path=value`; `${BUNDLE}` and `${RUN}` are the bundle and run folders.",
        "On the command line a whole list is `datasets='[{path: /x, type: sft}]'`; one field of an item the list",
        "already has is `datasets[0].path=/x` (or `datasets.0.path=/x`), applied in order with the other overrides;",
        "one item of a tuple is set the same way (`value.train.betas[0]=0.8` keeps the other item).",
        "A whole mapping on the command line replaces the mapping too, default and --config file's alike:",
        "`policy.model.cameras={}` leaves no camera, `policy.model.cameras.base_0_rgb=KEY` sets one entry, and a",
        "section given as a mapping (`policy.model={preset: tiny}`) keeps the fields it does not name.",
        "A mapping a --config file gives replaces the default's and an earlier file's the same way (a file's",
        "`cameras: {left_wrist_0_rgb: KEY}` is that one camera); a section in a file merges field by field.",
        "Both hold inside a list's items (`items: [{meta: {}}]` is an empty `meta`) and under a section whose",
        "default is null, which takes its defaults for the fields the value does not name.",
        "`portable run --print-config` writes plain YAML (paths as strings, enums by name) starting with",
        "`recipe: NAME` (with --json the same as one JSON document): `portable run --config` reads either back to",
        "the same config.",
        "`\\${a.b}` is the literal text `${a.b}` (OmegaConf's escape), not the value of a.b; --print-config prints",
        "such a literal escaped again (`\\${a.b}`, in the JSON too), so that it reads back as the literal.",
        "An untyped (Any) field of a recipe's own schema takes any value given whole (a mapping, a list, a scalar),",
        "which replaces what it held, a `${...}` included.",
        "A --config file is UTF-8 text of at most 1 MB (CONFIG_FILE_MAX_BYTES); a larger one is refused, exit 4.",
        "BUNDLE and RUN come from the command (the bundle argument, --output): an override of one it sets is refused.",
        "A float key takes finite numbers: nan and inf (`.nan`, `.inf`, `1e400`) are refused, exit 4.",
        "A bool key takes true or false (YAML's yes/no too; null where the type says `| None`): 0, 1, 2, 0.5 and",
        'the quoted string "false" are refused, exit 4, and so is a `${...}` that resolves to one of them.',
        "`key=` with nothing after the `=` (and `key:` with no value in a file) is null, not an empty string: a key",
        "whose type says `| None` is then null, and any other key (a str included) refuses it, exit 4; an empty string",
        'is `key=""` (in single quotes for the shell). Hydra\'s `+key=value` (add) and `~key` (delete) are not',
        "supported: every key exists already, so write `key=value`, or leave a key out for its default.",
        "OmegaConf's resolvers resolve too (`${oc.env:NAME}`, `${oc.env:NAME,default}`, `${oc.decode:...}`,",
        "`${oc.create:...}`, `${oc.select:...}`), once, when the config loads: --print-config and the run's record",
        "keep the resolved value, so a --resume under another environment finds that key's value changed and refuses",
        "the stages it feeds like any changed key. They work but are discouraged: write the value itself, so that the",
        "config file says what ran. An unknown resolver or a missing variable is refused, exit 4, naming the key.",
        "A row citing DEMO_LAB names the team's design notes, which are not in this repository (docs/architecture.md,",
        '"Notes outside this repository").',
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    _walk(schema, "", lines)
    return "\n".join(lines) + "\n"


def _type_name(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return str(text).replace("typing.", "").replace("|", "\\|")


def _walk(cls: type, prefix: str, lines: list[str], instance: Any = None) -> None:
    docs = field_docs(cls)
    hints = _resolved_types(cls)
    if instance is None:
        try:
            instance = cls()
        except Exception:
            instance = None
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp):
            lines.append(f"| **{key}** | section | | {docs.get(f.name, '')} |")
            _walk(tp, key + ".", lines, getattr(instance, f.name, None))
            continue
        default = getattr(instance, f.name, "") if instance is not None else ""
        shown = "" if default in ("???", "") else f"`{to_plain(default)!r}`"
        lines.append(f"| `{key}` | {_type_name(tp)} | {shown} | {docs.get(f.name, '').replace('|', '/')} |")
        item = _list_item(tp)
        if item is not None:
            _walk(item, key + "[].", lines)


def _resolved_types(cls: type) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(cls)
    except Exception:
        return {}


def _list_item(tp: Any) -> type | None:
    import typing

    if typing.get_origin(tp) is list:
        (arg,) = typing.get_args(tp) or (None,)
        if arg is not None and dataclasses.is_dataclass(arg):
            return arg
    return None


if __name__ == "__main__":  # docs/config.md: the default recipe's keys (found by name: run/ imports no recipe)
    import sys

    from reproduction.run.resolve import recipe_schema, resolve_recipe

    sys.stdout.write(reference(recipe_schema(resolve_recipe(DEFAULT_RECIPE))))
