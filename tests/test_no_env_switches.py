"""Code paths are chosen by typed config, never by environment variables: no module of the project
reads a READY_* variable (a switch would run different code without a trace in the run's config)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READS = re.compile(r"""(environ\s*(\.get\s*\(|\[)|getenv\s*\()\s*f?["']READY_""")


def test_no_module_reads_a_ready_environment_variable():
    offenders = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
                 for pkg in ("ready", "benchmarks", "kernels", "sweeps", "reports")
                 for path in sorted((ROOT / pkg).rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if READS.search(line)]
    assert not offenders, "READY_* environment switches (make them config fields):\n" + "\n".join(offenders)


def test_the_pattern_sees_the_forms_a_switch_takes():
    for line in ('os.environ.get("READY_X", "1")', "os.environ['READY_X']", 'os.getenv("READY_X")'):
        assert READS.search(line), line
    assert not READS.search('os.environ.get("CUDA_VISIBLE_DEVICES")')
