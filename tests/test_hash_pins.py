"""Row, setting and training-artifact hashes are pinned: every sweep x profile (and the 27B preset's main
table) hashes as at commit a56215a, so a rename in the config (issue 76 item 3: `drafter.block_size` ->
`drafter.proposals`) keeps finding the runs, trained drafters and caches made before it.

A change that means to move hashes rewrites the pins, and says why in its commit:
    python tests/test_hash_pins.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

PINS = Path(__file__).parent / "fixtures" / "hash_pins.json"
PROFILES = (None, "smoke", "paper_recipe")
EXTRA = (("main", "qwen3_5_27b", None), ("main", "qwen3_5_27b", "gpu_shape"))


def combos() -> list[tuple[str, Optional[str], Optional[str]]]:
    from sweeps.spec import list_sweeps

    return [(name, None, profile) for name in sorted(list_sweeps()) for profile in PROFILES] + list(EXTRA)


def key(name: str, preset: Optional[str], profile: Optional[str]) -> str:
    return f"{name}|{preset or '-'}|{profile or '-'}"


def hashes(name: str, preset: Optional[str], profile: Optional[str]) -> dict[str, Any]:
    """What one sweep setting hashes: the setting, every row's variant id and job hash, and the specs of
    its base drafter and stages (`ready.train.pipeline`: the trained drafters' folders are named by them)."""
    from ready.config import config_hash
    from ready.train.pipeline import base_spec, stage_spec
    from sweeps.spec import load_sweep

    s = load_sweep(name, ([f"preset={preset}"] if preset else []) + ([f"profile={profile}"] if profile else []))
    trained = {v.label: [config_hash(base_spec(v.cfg, "data")),
                         *(config_hash(stage_spec(v.cfg, st, "start", "data")) for st in ("stage1", "stage2"))]
               for v in s.rows if v.method != "ar"}
    return {"setting": s.setting, "variants": {v.label: v.variant_id for v in s.rows},
            "jobs": {f"{j.variant.label}|{j.seed}": j.config_hash for j in s.jobs()}, "trained": trained}


@pytest.mark.parametrize("name,preset,profile", combos())
def test_hashes_are_as_pinned(name, preset, profile):
    pinned = json.loads(PINS.read_text())[key(name, preset, profile)]
    assert hashes(name, preset, profile) == pinned


def write() -> None:
    PINS.write_text(json.dumps({key(*c): hashes(*c) for c in combos()}, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_hash_pins.py --write")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    write()
