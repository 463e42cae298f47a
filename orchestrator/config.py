"""Load a model config (YAML) into a validated WarmupSpec; every failure is one line naming the field."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import UserError
from orchestrator.jobs.records import Remote
from orchestrator.jobs.spec import MAX_BUCKET, WarmupSpec, validate_buckets

DEFAULT_CACHE_ROOT = "~/.cache/orchestrate"


class ConfigError(UserError):
    pass


def load_spec(path: str | Path) -> WarmupSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"config {path}: no such file; pass --model with a YAML file such as examples/mlp.yaml"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"config {path}: cannot read it ({exc.__class__.__name__}); pass a readable YAML file"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path}: invalid YAML {_yaml_where(exc)}: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(
            f"config {path}: nests deeper than the YAML parser follows; a config is a few levels deep"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config {path}: expected a mapping of fields (model, inputs, ...), got {type(data).__name__}"
        )
    if data.get("name") is None:  # absent or `name: null`: the file's stem
        data["name"] = _label(path.stem)
    try:
        spec = WarmupSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"config {path}: {describe(exc, WarmupSpec)}") from None
    return spec.with_base_dir(path.resolve().parent)


def apply_overrides(
    spec: WarmupSpec,
    *,
    buckets: Optional[list[int] | dict[Optional[str], list[int]]] = None,
    device: Optional[str] = None,
    cache_dir: Optional[str] = None,
) -> WarmupSpec:
    """`buckets`: the bucket dimension's sizes, or sizes by dimension name as parse_buckets reads
    them (the key None for the bucket dimension); a dimension not named keeps the config's."""
    changes: dict[str, Any] = {}
    if isinstance(buckets, dict):
        sizes = {spec.bucket_symbol: list(spec.buckets), **(spec.grid or {})}
        for dim, values in buckets.items():
            sizes[dim or spec.bucket_symbol] = values
        if len(sizes) == 1:
            changes["buckets"] = sizes[spec.bucket_symbol]
        else:
            changes["buckets"], changes["grid"] = sizes, None
            if spec.points:
                changes["points"] = _points_within(spec.points.model_dump(), sizes)
    elif buckets is not None:
        changes["buckets"] = buckets
    if device is not None:
        changes["device"] = device
    if cache_dir is not None:
        # a path typed on the command line is relative to where it was typed, not to the config
        changes["cache_dir"] = str(Path(cache_dir).expanduser().resolve())
    if not changes:
        return spec
    try:
        return spec.replaced(**changes)
    except ValidationError as exc:
        raise ConfigError(describe(exc, WarmupSpec)) from None


def load_spec_with_overrides(
    path: str | Path, *, buckets: Optional[str] = None, device: Optional[str] = None, cache_dir: Optional[str] = None
) -> WarmupSpec:
    """The spec a command runs: the config at `path`, then the command line's overrides over it.
    `buckets` is the --buckets text as typed (None: the config's buckets stand). The config is
    read and checked first, so a broken config is reported before a bad --buckets."""
    spec = load_spec(path)
    spec = apply_overrides(
        spec, buckets=None if buckets is None else parse_bucket_dims(buckets), device=device, cache_dir=cache_dir
    )
    check_cache_dir(cache_root(spec), "--cache-dir" if cache_dir else f"config {path}: cache_dir")
    return spec


def check_cache_dir(root: Path, named: str = "--cache-dir") -> None:
    """A cache root that is a file fails every command that uses it, some only after Ray or a model
    has started: refused here, with the config, in one line."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{named} {root}: a file, not a directory; pass a directory (made where missing)")


def parse_buckets(text: str) -> list[int]:
    """`--buckets 1,8,32` -> [1, 8, 32]; positive integers, no duplicates."""
    return _sizes(text)


def parse_bucket_dims(text: str) -> dict[Optional[str], list[int]]:
    """--buckets as typed: `1,8,32` -> {None: [1, 8, 32]}, the bucket dimension's sizes; a grid's
    dimensions by name, separated by spaces: `batch=1,8 seq=32,128`."""
    if "=" not in text:  # `1, 8, 32`, spaces allowed
        return {None: _sizes(text)}
    parts = text.split()
    out: dict[Optional[str], list[int]] = {}
    for part in parts:
        dim, equals, sizes = part.rpartition("=")
        if equals and not dim.isidentifier():
            raise ConfigError(
                f"--buckets: {dim!r} is not a dimension name; write e.g. --buckets 'batch=1,8 seq=32,128'"
            )
        name = dim if equals else None
        if name in out:
            raise ConfigError(f"--buckets: {name or 'the bucket dimension'} is given twice")
        out[name] = _sizes(sizes)
    return out


def _points_within(points: dict[str, Any], sizes: dict[str, list[int]]) -> Optional[dict[str, Any]]:
    """The config's `points` where --buckets changed the grid: a cap stays; a list keeps the
    points still on the grid (none left: every point)."""
    if points.get("only") is None:
        return points
    kept = [p for p in points["only"] if all(size in values for size, values in zip(p, sizes.values(), strict=False))]
    return {**points, "only": kept} if kept else None


def _sizes(text: str) -> list[int]:
    buckets = []
    for item in (part.strip() for part in text.split(",")):
        if not (item.isascii() and item.isdecimal()) or int(item) <= 0:
            raise ConfigError(f"--buckets: {item!r} is not a positive integer; write e.g. --buckets 1,8,32")
        if int(item) > MAX_BUCKET:
            raise ConfigError(f"--buckets: {item} rows is more than a bucket may hold ({MAX_BUCKET})")
        buckets.append(int(item))
    try:
        return validate_buckets(buckets)
    except ValueError as exc:
        raise ConfigError(f"--buckets: {exc}") from None


def format_buckets(buckets: list[int]) -> str:
    """[1, 8, 32] -> `1,8,32`: read back by parse_buckets."""
    return ",".join(map(str, buckets))


def format_bucket_dims(spec: WarmupSpec) -> str:
    """The --buckets text a submitted job's command line carries, read back by parse_bucket_dims:
    `1,8,32`, or a grid's `batch=1,8 seq=32,128`."""
    if not spec.grid:
        return format_buckets(spec.buckets)
    sizes = {spec.bucket_symbol: spec.buckets, **spec.grid}
    return " ".join(f"{dim}={format_buckets(values)}" for dim, values in sizes.items())


def cache_root(spec: WarmupSpec) -> Path:
    """--cache-dir / config `cache_dir` > $ORCHESTRATE_CACHE_DIR > ~/.cache/orchestrate."""
    if spec.cache_dir:
        root = Path(spec.cache_dir).expanduser()
        return root if root.is_absolute() else spec.base_dir / root
    return default_cache_root()


def default_cache_root() -> Path:
    return Path(os.environ.get("ORCHESTRATE_CACHE_DIR") or DEFAULT_CACHE_ROOT).expanduser().resolve()


def describe(exc: ValidationError, model: type[BaseModel]) -> str:
    """Pydantic's errors as `field.path: problem` items on one line."""
    items = []
    for error in exc.errors():
        where = _path(error["loc"])
        if error["type"] == "extra_forbidden":
            allowed = _fields_at(model, error["loc"][:-1])
            hint = difflib.get_close_matches(str(error["loc"][-1]), allowed, n=1)
            fix = f"did you mean {hint[0]!r}?" if hint else f"allowed: {', '.join(allowed)}"
            items.append(f"{where}: unknown field ({fix})")
        elif error["type"] == "missing":
            items.append(f"{where}: required field is missing")
        else:
            message = error["msg"].removeprefix("Value error, ")
            items.append(f"{where}: {message}" if where else message)
    shown = "; ".join(items[:3])
    return shown + (f" (and {len(items) - 3} more)" if len(items) > 3 else "")


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("int", "str", "tuple[int, int]", "function-after[_factory_form(), str]"):
            continue  # pydantic names union branches and validators in loc; users never wrote them
        else:
            out += f".{part}" if out else str(part)
    return out


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model that `loc` points into, for 'did you mean'."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                current = candidate
                break
    return sorted(getattr(current, "model_fields", {}))


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    return getattr(exc, "problem", None) or str(exc).splitlines()[0]


def _label(stem: str) -> str:
    cleaned = "".join(c if (c.isascii() and c.isalnum()) or c in "_.-" else "-" for c in stem).strip("-._")
    return cleaned or "model"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def embedded_store(root: Path, allow_unsigned: bool, trust: Iterable[str] = ()) -> Remote:
    """The store when none is given: a directory beside the local cache, with a key pair made once
    and kept there (private key `.signing-key`, mode 0600; public key `.signing-key.pub`), so the
    default path is signed and verified like production with nothing to set up. A signing key the
    environment configures signs instead; the store's own public key is trusted either way."""
    from orchestrator.cache.manifest import SigningKey, TrustedKeys

    store = root / "store"
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cache directory {root}: cannot create the local store ({exc.strerror}); pass a writable --cache-dir"
        ) from None
    key_file = root / ".signing-key"
    try:
        SigningKey.create_file(key_file)
    except OSError as exc:
        raise UserError(
            f"cache directory {root}: cannot write the local store's key ({exc.strerror}); pass a writable --cache-dir"
        ) from None
    trusted = TrustedKeys.load([*trust, SigningKey.public_path(key_file)]).pems()
    configured = SigningKey.from_env() is not None
    return Remote(f"file://{store}", allow_unsigned, None if configured else str(key_file), trusted)
