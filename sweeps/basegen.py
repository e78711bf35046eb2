"""Keep experiments/base.yaml equal to the schema in ready/config.py.

    python -m sweeps.basegen --check    # exit 1 and list the knobs that differ
    python -m sweeps.basegen --write    # rewrite base.yaml from the schema

The rewrite keeps every comment already in base.yaml; a knob new to the schema takes the comment
written beside its field in ready/config.py (or says it has none yet).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import ready.config as C
from ready.config import EXPERIMENTS_DIR, entry_point, to_container

HEADER_END = "\n\n"


def source_comments() -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """(class, field) -> the comment beside (or just above) the field; class -> first docstring line."""
    src = Path(C.__file__).read_text()
    lines = src.splitlines()
    fields, docs = {}, {}
    for node in ast.parse(src).body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs[node.name] = (ast.get_docstring(node) or "").split("\n")[0].rstrip(".")
        for st in node.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                line = lines[st.lineno - 1]
                beside = line.split("#", 1)[1].strip() if "#" in line and not line.strip().startswith("#") else ""
                above, j = [], st.lineno - 2
                while j >= 0 and lines[j].strip().startswith("#"):
                    above.insert(0, lines[j].strip()[1:].strip())
                    j -= 1
                fields[(node.name, st.target.id)] = " ".join(above + ([beside] if beside else []))
    return fields, docs


def yaml_comments(path: Path) -> dict[str, str]:
    """Dotted key -> the comment written after it in an existing base.yaml."""
    out, stack = {}, []
    for line in path.read_text().splitlines() if path.is_file() else []:
        if not line.strip() or line.lstrip().startswith("#") or ":" not in line:
            continue
        indent = (len(line) - len(line.lstrip())) // 2
        key = line.strip().split(":", 1)[0]
        stack = stack[:indent] + [key]
        if "  # " in line:
            out[".".join(stack)] = line.split("  # ", 1)[1].strip()
    return out


def _flow(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_flow(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_flow(x)}" for k, x in v.items()) + "}"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        text = repr(v)
        return text if "e" not in text or "." in text.split("e")[0] else text.replace("e", ".0e")
    if isinstance(v, str):
        plain = v and all(ch.isalnum() or ch in "_-./" for ch in v) and v not in ("true", "false", "null", "yes", "no")
        try:
            float(v)
            plain = False
        except ValueError:
            pass
        return v if plain else json.dumps(v)
    return str(v)


def render(path: Path = EXPERIMENTS_DIR / "base.yaml") -> str:
    fields, docs = source_comments()
    kept = yaml_comments(path)
    old = path.read_text() if path.is_file() else ""
    header = old.split(HEADER_END, 1)[0] + HEADER_END if old.startswith("#") else ""
    out: list[str] = []

    def emit(cls: type, obj: Any, prefix: str, indent: int) -> None:
        for f in dataclasses.fields(cls):
            value, key, pad = getattr(obj, f.name), prefix + f.name, "  " * indent
            if dataclasses.is_dataclass(value):
                note = kept.get(key) or fields.get((cls.__name__, f.name)) or docs.get(type(value).__name__, "")
                if indent == 0 and out:
                    out.append("")
                out.append(f"{pad}{f.name}:" + (f"  # {note}" if note else ""))
                emit(type(value), value, key + ".", indent + 1)
            else:
                note = kept.get(key) or fields.get((cls.__name__, f.name)) or f"{key} (no comment in ready/config.py yet)"
                out.append(f"{pad}{f.name}: {_flow(value)}  # {note}")

    emit(C.Config, C.Config(), "", 0)
    return header + "\n".join(out) + "\n"


def drift(path: Path = EXPERIMENTS_DIR / "base.yaml") -> list[str]:
    """Knobs that base.yaml lacks, adds, or sets to another value than the schema."""
    def leaves(tree: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in tree.items():
            if isinstance(v, dict) and v:
                out.update(leaves(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    base = leaves(OmegaConf.to_container(OmegaConf.load(path)))
    schema = leaves(to_container(C.schema()))
    out = [f"missing: {k}" for k in schema if k not in base]
    out += [f"unknown: {k}" for k in base if k not in schema]
    out += [f"differs: {k} = {base[k]!r} (schema {schema[k]!r})" for k in base if k in schema and base[k] != schema[k]]
    return out


@entry_point
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweeps.basegen", description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true")
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    path = EXPERIMENTS_DIR / "base.yaml"
    if args.write:
        path.write_text(render(path))
    problems = drift(path)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
