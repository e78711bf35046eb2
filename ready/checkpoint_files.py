"""A checkpoint folder read as data, the one way both loaders (the target's and the drafter's) read theirs.

A Hugging Face folder (config.json, model.safetensors or shards named by model.safetensors.index.json)
comes from elsewhere and may have been edited by hand. Everything read from it is checked here before
anything is built or allocated, and a problem is one error (the loader's own type, passed as `error`)
naming the file, the field or the tensor, and what was expected:

- `Fields`: a config.json's fields, typed and ranged (`hidden_size: "abc"`, `num_attention_heads: 0`,
  `rms_norm_eps: "tiny"` are refused by name, never a TypeError from deep inside torch);
- `weight_files`: the weight files a folder's index names, each a file inside the folder (an entry
  `../foreign/model.safetensors`, an absolute path or a symbolic link out of the folder is refused;
  links of a Hugging Face cache snapshot into its own `blobs/` are that folder's files);
- `tensor_headers`: every tensor's dtype and shape from the files' headers, without reading its data:
  floating dtypes only, and no tensor held by two files;
- `check_layers` and `check_fits`: a config that declares more layers than its files hold, or
  parameters that do not fit in the host's (or the device's) memory, is refused before allocation.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping, Optional

ErrorType = Callable[[str], Exception]
MISSING: Any = object()
FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}  # safetensors dtype -> bytes


def read_json(file: Path, expected: str, error: ErrorType) -> dict:
    """The JSON object in `file`, or one error naming the file."""
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise error(f"{file}: not readable JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                    f"expected {expected}") from None
    if not isinstance(raw, dict):
        raise error(f"{file}: holds a JSON {type(raw).__name__}; expected {expected} (a JSON object)")
    return raw


# --- config fields ------------------------------------------------------------------------------

class Fields:
    """Typed, ranged reads of a config's fields: `Fields(raw, "DIR/config.json", DrafterError).integer(
    "hidden_size", low=1)`. A missing or null field takes `default` when one is given; a value of the
    wrong type or out of range is one error naming the file and the field (`prefix` + key)."""

    def __init__(self, raw: Mapping[str, Any], source: str, error: ErrorType, prefix: str = "") -> None:
        self.raw, self.source, self.error, self.prefix = raw, source, error, prefix

    def refuse(self, key: str, value: Any, expected: str) -> Exception:
        shown = "missing" if value is MISSING else f"{value!r}"
        return self.error(f"{self.source}: {self.prefix}{key} is {shown}; expected {expected}")

    def _get(self, key: str, default: Any, expected: str) -> tuple[Any, bool]:
        """(value, given): the field's value, or (default, False) when it is missing or null."""
        value = self.raw.get(key, MISSING)
        if value is MISSING or value is None:
            if default is MISSING:
                raise self.refuse(key, value, expected)
            return default, False
        return value, True

    def integer(self, key: str, default: Any = MISSING, low: Optional[int] = None,
                high: Optional[int] = None) -> Any:
        """An integer in [low, high] (an integral float such as 2.0 counts; a bool does not)."""
        expected = _range_text("an integer", low, high)
        value, given = self._get(key, default, expected)
        if not given:
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not _in(value, low, high):
            raise self.refuse(key, value, expected)
        return value

    def number(self, key: str, default: Any = MISSING, low: Optional[float] = None, above: Optional[float] = None,
               high: Optional[float] = None) -> Any:
        """A finite number, >= low (or > above) and <= high."""
        expected = _range_text("a finite number", low, high, above)
        value, given = self._get(key, default, expected)
        if not given:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not _in(value, low, high) or (above is not None and not value > above):
            raise self.refuse(key, value, expected)
        return float(value)

    def flag(self, key: str, default: Any = MISSING) -> Any:
        value, given = self._get(key, default, "true or false")
        if given and not isinstance(value, bool):
            raise self.refuse(key, value, "true or false")
        return value

    def text(self, key: str, default: Any = MISSING, choices: Optional[tuple[str, ...]] = None) -> Any:
        expected = f"one of {list(choices)}" if choices else "a string"
        value, given = self._get(key, default, expected)
        if not given:
            return value
        if not isinstance(value, str) or (choices and value not in choices):
            raise self.refuse(key, value, expected)
        return value

    def texts(self, key: str, default: Any = MISSING) -> Any:
        value, given = self._get(key, default, "a list of strings")
        if not given:
            return value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.refuse(key, value, "a list of strings")
        return value

    def integers(self, key: str, default: Any = MISSING, low: Optional[int] = None, high: Optional[int] = None,
                 extra: str = "") -> Any:
        expected = _range_text("a list of integers", low, high) + extra
        value, given = self._get(key, default, expected)
        if not given:
            return value
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and _in(v, low, high)
                                                  for v in value):
            raise self.refuse(key, value, expected)
        return value

    def block(self, key: str, default: Any = MISSING) -> Any:
        """A nested object (a dict), e.g. dflash_config or rope_scaling."""
        value, given = self._get(key, default, "an object")
        if not given:
            return value
        if not isinstance(value, dict):
            raise self.refuse(key, value, "an object")
        return value

    def sub(self, key: str) -> "Fields":
        """The fields of the nested object at `key` (which must be one), named `key.field` in messages."""
        return Fields(self.block(key), self.source, self.error, prefix=f"{self.prefix}{key}.")


def _in(value: float, low: Optional[float], high: Optional[float]) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _range_text(what: str, low: Optional[float], high: Optional[float], above: Optional[float] = None) -> str:
    if above is not None:
        return f"{what} > {above:g}" + (f" and <= {high:g}" if high is not None else "")
    if low is not None and high is not None:
        return f"{what} in {low:g}..{high:g}"
    if low is not None:
        return f"{what} >= {low:g}"
    if high is not None:
        return f"{what} <= {high:g}"
    return what


# --- weight files ---------------------------------------------------------------------------------

def inside(folder: Path, name: Any, what: str, error: ErrorType) -> Path:
    """`folder / name` when `name` is a relative path to a file inside `folder` (a symbolic link whose
    target stays inside; in a Hugging Face cache snapshot also one into the repository's own `blobs/`),
    else one error saying what `what` names and where it leads."""
    if not isinstance(name, str) or not name:
        raise error(f"{what} is {name!r}; expected a file name inside {folder}")
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or re.match(r"^[A-Za-z]:", name):
        raise error(f"{what} is {name!r}, outside {folder}; expected a file inside the checkpoint folder "
                    "(its identity and its weights are that folder's)")
    path = folder / pure
    real, home = path.resolve(), folder.resolve()
    blobs = home.parent.parent / "blobs" if home.parent.name == "snapshots" else None
    if not (real.is_relative_to(home) or (blobs is not None and real.is_relative_to(blobs))):
        raise error(f"{what} is {name!r}, a symbolic link to {real}, outside {folder}; expected a file inside the "
                    "checkpoint folder (its identity and its weights are that folder's)")
    if not path.is_file():
        raise error(f"{what} is {name!r}, but {path} is {'a folder' if path.is_dir() else 'missing'}; expected "
                    "the file beside the index")
    return path


def weight_files(folder: Path, error: ErrorType, single: str = "model.safetensors",
                 index: str = "model.safetensors.index.json", any_safetensors: bool = False) -> list[Path]:
    """The weight files of `folder`: the files its index's `weight_map` names (each inside the folder),
    else `single`, else (with `any_safetensors`) every *.safetensors file at its top level."""
    index_file = folder / index
    if index_file.is_file():
        weight_map = read_json(index_file, "a safetensors index with a 'weight_map' object", error).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise error(f"{index_file}: weight_map is {weight_map!r}; expected an object naming each tensor's "
                        "file, e.g. {\"lm_head.weight\": \"model-00001-of-00002.safetensors\"}")
        files: dict[Path, None] = {}
        for tensor, name in sorted(weight_map.items(), key=lambda kv: (str(kv[1]), kv[0])):
            files[inside(folder, name, f"{index_file}: weight_map[{tensor!r}]", error)] = None
        return sorted(files)
    if (folder / single).exists() or (folder / single).is_symlink():
        return [inside(folder, single, f"{folder}: {single}", error)]
    if any_safetensors:
        shards = sorted(folder.glob("*.safetensors"))
        if shards:
            return [inside(folder, p.name, f"{folder}: {p.name}", error) for p in shards]
    raise error(f"{folder}: no {single} (or {index} with shards); expected the checkpoint's weights")


@dataclass(frozen=True)
class TensorHeader:
    """What a safetensors header says of one tensor (its data unread)."""

    file: Path
    key: str  # its name in the file (the loader's name may differ: legacy prefixes)
    dtype: str  # safetensors' name: F32, BF16, I64, BOOL, ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def tensor_headers(files: list[Path], error: ErrorType,
                   rename: Callable[[str], Optional[str]] = lambda key: key) -> dict[str, TensorHeader]:
    """Every tensor of `files` under the loader's name (`rename`; None = a tensor the loader ignores), read
    from the headers only. One error for an unreadable file or a name held twice (two shards with the same
    tensor: one would silently win)."""
    from safetensors import safe_open

    out: dict[str, TensorHeader] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as sf:
                found = [(key, sf.get_slice(key)) for key in sf.keys()]
                headers = [(key, s.get_dtype(), tuple(int(n) for n in s.get_shape())) for key, s in found]
        except Exception as e:  # SafetensorError (truncated, bad header), OSError (unreadable)
            raise error(f"{file}: not a readable safetensors file ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); expected the checkpoint's weights as written") from None
        for key, dtype, shape in headers:
            name = rename(key)
            if name is None:
                continue
            if name in out:
                first = out[name]
                where = f"twice in {file}" if first.file == file else f"in both {first.file} and {file}"
                alias = f" (as {first.key} and {key})" if first.key != key else ""
                raise error(f"tensor {name} is {where}{alias}; expected each tensor once (one of two copies would "
                            "silently win)")
            out[name] = TensorHeader(file, key, dtype, shape)
    return out


def check_floating(headers: Mapping[str, TensorHeader], error: ErrorType) -> None:
    """One error naming the first tensor whose dtype is not floating-point: an integer or boolean tensor would
    be cast to float without a word."""
    for name, h in headers.items():
        if h.dtype not in FLOAT_DTYPES:
            raise error(f"{h.file}: tensor {h.key} has dtype {h.dtype}; expected floating-point weights "
                        f"({', '.join(FLOAT_DTYPES)}): an integer or boolean tensor is no weight")


def check_finite(tensors: Mapping[str, Any], file: Path, error: ErrorType) -> None:
    """One error naming the first tensor of `file` that holds NaN or Inf."""
    import torch

    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise error(f"{file}: tensor {name} holds NaN or Inf values; expected finite weights")


# --- sizes ----------------------------------------------------------------------------------------

def layer_count(names: Any, prefix: str) -> int:
    """1 + the highest layer index among tensor names `prefix<i>.…` (0 when none)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = [int(m.group(1)) for n in names if (m := pattern.match(n))]
    return max(found) + 1 if found else 0


def check_layers(declared: int, held: int, field: str, source: str, error: ErrorType) -> None:
    """A config that declares more layers than its weight files hold is refused before a layer is built
    (200,000 declared layers took minutes to build, then failed on the missing weights)."""
    if declared > held:
        raise error(f"{source}: {field} is {declared}, but its weight files hold {held} layer(s); expected the "
                    "config its weights were saved with")


def host_memory() -> int:
    """Bytes of physical memory of this host (0 when the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def device_memory(device: Any) -> int:
    """Bytes of memory of a CUDA device (0 for the CPU: the host's memory is checked instead)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return 0
    return int(torch.cuda.get_device_properties(dev.index if dev.index is not None else torch.cuda.current_device())
               .total_memory)


def check_fits(nbytes: int, device: Any, what: str, error: ErrorType) -> None:
    """Parameters of `nbytes` are refused before allocation when they exceed this host's memory (every
    loader reads weights on the host first) or the device's. `what` names the field(s) that make them."""
    for where, have in (("this host", host_memory()), (f"device {device}", device_memory(device))):
        if have and nbytes > have:
            raise error(f"{what}: {_gb(nbytes)} of parameters, more than the {_gb(have)} of memory of {where}; "
                        "expected a model that fits")


def _gb(nbytes: int) -> str:
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:,.1f} GB"
    return f"{nbytes / 1e6:,.1f} MB" if nbytes >= 1e6 else f"{nbytes:,} bytes"
