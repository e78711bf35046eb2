"""`ready COMMAND [ARGS ...]`: one command line for every entry point; each is `python -m MODULE [ARGS ...]`.

    ready --help                          # every command, with the module it runs and what it does
    ready sweep rank --dry-run            # = python -m sweeps.run rank --dry-run
    ready bench engine --json             # = python -m benchmarks.engine --json
    ready diagnose context_ceiling --windows 16

A command hands the rest of its command line to its module's `main(argv)`, so every flag and its help
live once, in the module that owns them (`ready sweep --help` is `python -m sweeps.run --help`), and
every `python -m` command keeps working as it is. The commands are `COMMANDS` (the top-level entry
points) plus the groups in `GROUPS`, discovered: every module of `benchmarks` (`ready bench NAME`) and
`benchmarks.diagnostics` (`ready diagnose NAME`) with a top-level `main` is a command (a group's own modules:
the subpackage benchmarks/diagnostics is no `ready bench` command). Help is read from the
modules' sources without importing them, and a module is imported only when its command runs, so
`ready --help` needs no torch. Installed as the console script `ready` ([project.scripts]); without the
install, `python -m sweeps.cli` is the same. It sits above the library because its commands do.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

# the top-level commands: name -> module (a module with `main(argv)`)
COMMANDS = {
    "sweep": "sweeps.run",
    "report": "reports.build",
    "findings": "reports.findings",
    "lengths-figure": "reports.lengths",
    "calibration": "reports.calibration",
    "generate": "sweeps.commands.generate",
    "export": "sweeps.commands.export",
    "launch": "sweeps.commands.train_launch",
    "launch-row": "sweeps.launch",
    "build-data": "sweeps.commands.build_data",
    "basegen": "sweeps.basegen",
    "check-workers": "sweeps.check_workers",
    "relocate-store": "sweeps.relocate",
    "phases": "sweeps.phases",
    "ui": "sweeps.ui",
}
# the groups: name -> (package whose modules with a `main` are its commands, what they are)
GROUPS = {
    "bench": ("benchmarks", "benchmarks, each prints JSON"),
    "diagnose": ("benchmarks.diagnostics", "diagnostics: one-off questions asked of the method"),
}
# modules run as `python -m` that are not commands, and why
NOT_COMMANDS = {
    "sweeps.worker": "started by `ready sweep --workers N`, not typed by hand",
    "sweeps.cli": "this dispatcher",
}


def _key(name: str) -> str:
    return name.replace("-", "_")


def source(module: str) -> Path:
    """The source file of `module`, found without importing it or its parent packages (only the
    top-level package's location is looked up)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"no package {top!r}")
    for base in spec.submodule_search_locations:
        path = Path(base, *rest)
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
    raise ModuleNotFoundError(f"no module {module!r}")


def _parse(module: str) -> ast.Module:
    return ast.parse(source(module).read_text(encoding="utf-8"))


def has_main(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)


def summary(tree: ast.Module) -> str:
    """The first sentence of a module's docstring, less a leading "`python -m ...`: "."""
    doc = ast.get_docstring(tree) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    if text.startswith("`") and "`: " in text:
        text = text.split("`: ", 1)[1]
    for end in (". ", "? "):
        if end in text:
            text = text.split(end, 1)[0] + end.strip()
    return text[:1].upper() + text[1:]


def group_commands(package: str) -> dict[str, str]:
    """name -> module for every module of `package` itself (not of its subpackages) with a top-level `main`,
    by name."""
    folder = source(package).parent
    out = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        module = f"{package}.{path.stem}"
        if has_main(_parse(module)):
            out[path.stem] = module
    return out


def table() -> dict[str, str]:
    """Every command line -> its module: "sweep" -> "sweeps.run", "bench engine" -> "benchmarks.engine"."""
    out = dict(COMMANDS)
    for group, (package, _) in GROUPS.items():
        out.update({f"{group} {name}": module for name, module in group_commands(package).items()})
    return out


def _rows(sections: list[tuple[str, dict[str, str]]], width: int = 120) -> list[str]:
    """Each section's heading, then one line per command: name, module, summary (clipped to `width`)."""
    every = [c for _, commands in sections for c in commands.items()]
    nw, mw = max(len(n) for n, _ in every) + 2, max(len(m) for _, m in every) + 2
    lines = []
    for heading, commands in sections:
        lines += ["", heading]
        for name, module in commands.items():
            text, room = summary(_parse(module)), width - 2 - nw - mw
            if len(text) > room:
                text = text[:room - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."
            lines.append(f"  {name:<{nw}}{module:<{mw}}{text}")
    return lines


def help_text(group: Optional[str] = None) -> str:
    """`ready --help` (every command), or `ready GROUP --help` (the group's)."""
    if group is not None:
        package, what = GROUPS[group]
        return "\n".join([f"usage: ready {group} NAME [ARGS ...]   (= python -m {package}.NAME [ARGS ...]; "
                          f"`ready {group} NAME --help`: its options)",
                          *_rows([(f"{what}:", group_commands(package))])])
    sections = [("commands:", COMMANDS)]
    sections += [(f"ready {name} NAME: {what} ({package}.NAME):", group_commands(package))
                 for name, (package, what) in GROUPS.items()]
    return "\n".join(["usage: ready COMMAND [ARGS ...]   (= python -m MODULE [ARGS ...]; `ready COMMAND --help`: "
                      "its options)", *_rows(sections)])


def exit_status(module: Any, result: Any) -> int:
    """What `python -m MODULE` exits with after its `main()` returned `result`: the module's own
    `exit_status(result)` where it has one, else an int as it is and anything else as 0."""
    if hasattr(module, "exit_status"):
        return module.exit_status(result)
    return int(result) if isinstance(result, int) else 0


def run(prog: str, module_name: str, argv: Sequence[str]) -> int:
    """Import `module_name` now and run its `main(argv)` with `prog` as the program name in its help."""
    saved = sys.argv
    sys.argv = [prog, *argv]  # argparse's default prog; what a module reads at import sees these arguments
    try:
        module = importlib.import_module(module_name)
        from ready.config import entry_point  # the one rule for config errors (one line, exit 2), every command

        main = module.main if getattr(module.main, "__ready_entry_point__", False) else entry_point(module.main)
        return exit_status(module, main(list(argv)))
    finally:
        sys.argv = saved


def _unknown(where: str, name: str, choices: Sequence[str]) -> int:
    print(f"{where}: unknown command {name!r}; expected one of: {', '.join(choices)} (`{where} --help` says what "
          f"each does)", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(help_text(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    commands = {_key(n): (n, m) for n, m in COMMANDS.items()}
    if _key(name) in commands:
        shown, module = commands[_key(name)]
        return run(f"ready {shown}", module, rest)
    if name in GROUPS:
        if not rest or rest[0] in ("-h", "--help"):
            print(help_text(name), file=sys.stdout if rest else sys.stderr)
            return 0 if rest else 2
        members = group_commands(GROUPS[name][0])
        if _key(rest[0]) not in members:
            return _unknown(f"ready {name}", rest[0], list(members))
        return run(f"ready {name} {_key(rest[0])}", members[_key(rest[0])], rest[1:])
    return _unknown("ready", name, [*COMMANDS, *GROUPS])


if __name__ == "__main__":
    sys.exit(main())
