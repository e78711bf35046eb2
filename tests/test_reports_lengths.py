"""The context-length figure (issue 46 item 1) reads the engine benchmark's JSON as it is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.errors import ReportError
from reports.lengths import load_points, main

DATA = Path(__file__).resolve().parent.parent / "docs" / "data"


def engine_entry(n: int, gpu: str = "NVIDIA H200", drafters: bool = True) -> dict:
    """One length of `python -m benchmarks.engine`'s JSON, the fields the figure reads."""
    e = {"prompt_len": n, "gpu": gpu, "ar": {"decode_tokens_per_s": 70.0 - n / 1e4},
         "bound": {"bandwidth_bytes_per_s": 4.27e12, "step_ms_with_kv": 12.0 + n / 1e5}}
    if drafters:
        e["drafters"] = {"reader": {"readers_us": 24.0},
                         "runs": [{"dspark": {"decode_tokens_per_s": 250.0}, "ready": {"decode_tokens_per_s": 251.0},
                                   "ready_minus_dspark_us": {"draft_us": {"mean": 30.0, "lo": 5.0, "hi": 55.0}}}]}
    return e


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_the_committed_h100_run_gives_one_point_per_length():
    gpu, bandwidth, points = load_points([DATA / "lengths_h100_2026-12-07_11ec27a.json"])
    assert gpu == "NVIDIA H100 80GB HBM3" and [p.prompt_len for p in points] == [256, 1024, 8192, 32768]
    first = json.loads((DATA / "lengths_h100_2026-12-07_11ec27a.json").read_text())["by_prompt_len"][0]
    assert points[0].ar_tps == first["ar"]["decode_tokens_per_s"]
    assert points[0].ready_tps == first["drafters"]["runs"][0]["ready"]["decode_tokens_per_s"]
    assert points[0].readers_us == first["drafters"]["reader"]["readers_us"]
    assert points[0].ar_bound_tps == pytest.approx(1e3 / first["bound"]["step_ms_with_kv"])
    assert bandwidth == first["bound"]["bandwidth_bytes_per_s"]


def test_a_length_without_drafters_keeps_its_ar_point_and_the_figure_is_written(tmp_path, capsys):
    doc = {"by_prompt_len": [engine_entry(1024), engine_entry(32768, drafters=False)]}
    assert main([str(write(tmp_path / "lengths.json", doc)), "--out", str(tmp_path / "fig" / "lengths")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["prompt_len"] for p in out["points"]] == [1024, 32768]
    assert out["points"][1]["ar_tps"] == 70.0 - 32768 / 1e4 and out["points"][1]["ready_tps"] is None
    assert out["points"][0]["extra_draft_us"] == [30.0, 5.0, 55.0]
    assert (tmp_path / "fig" / "lengths.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "fig" / "lengths.pdf").read_bytes()[:5] == b"%PDF-"


def test_files_of_two_gpus_or_a_length_twice_are_one_clear_error(tmp_path, capsys):
    a = write(tmp_path / "a.json", engine_entry(1024))
    b = write(tmp_path / "b.json", engine_entry(8192, gpu="NVIDIA H100 80GB HBM3"))
    with pytest.raises(ReportError, match="different GPUs.*NVIDIA H200 in .*a.json.*NVIDIA H100"):
        load_points([a, b])
    with pytest.raises(ReportError, match="prompt length 1024 is given twice"):
        load_points([a, a])
    bad = write(tmp_path / "bad.json", {"rows": []})
    assert main([str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "bad.json: not the JSON of `python -m benchmarks.engine`" in capsys.readouterr().err
    assert not list(tmp_path.glob("x.*"))  # nothing written
    no_ar = write(tmp_path / "no_ar.json", {"prompt_len": 256, "ar": {}})
    with pytest.raises(ReportError, match="no_ar.json: .*expected `prompt_len` and `ar.decode_tokens_per_s`"):
        load_points([no_ar])
