"""The `gpu_shape` profile's logic on CPU with the tiny preset (issue 73): a random-weight target built once per
worker process and kept across rows, the phases every row logs, checkpoint folders loaded once, and the
profile resolving for every declared sweep. What only a GPU shows (peak memory, the graphed engine) is the
`cuda` test at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ready.loading
import ready.train.pipeline
from benchmarks.shape_folders import write_folders
from ready.loading import load_configured_target
from ready.phases import PHASES, PhaseRecord, phase_metrics
from ready.target.checkpoint import load_target
from sweeps import row
from sweeps.run import main as sweeps_main
from sweeps.spec import list_sweeps, load_sweep

# the profile's logic at smoke sizes: the shared 2-core test machine cannot afford 2,048-token rows
SMALL = ["target.device=cpu", "corpus.max_files=60", "corpus.vocab_size=512", "regen.num_samples=8", "regen.batch_size=8",
         "regen.prompt_len=56", "regen.response_len=12", "drafter.head_rank=16", "reader.mlp_hidden=32",
         "train.stage1.samples=8", "train.stage1.batch_size=4", "train.stage2.samples=8", "train.stage2.batch_size=4",
         "train.micro_batch_size=2", "train.lora.rank=4", "train.lora.alpha=8", "bench.max_prompt_tokens=40",
         "eval.max_new_tokens=8", "eval.warmup_rounds=0"]


def jobs(tmp_path: Path, extra: list[str] = ()) -> dict[str, object]:
    sweep = load_sweep("ft_control", ["preset=tiny", "profile=gpu_shape", f"artifacts_dir={tmp_path / 'artifacts'}",
                                      *SMALL, *extra])
    return {j.variant.method: j.cfg for j in sweep.jobs()}


@pytest.fixture
def counted_loads(monkeypatch):
    """Every target and drafter folder load of the process, by what was loaded."""
    seen: dict[str, list[str]] = {"target": [], "drafter": []}
    real_target, real_drafter = ready.loading.load_target, ready.train.pipeline.load_drafter

    def target(path, *a, **k):
        seen["target"].append(str(path))
        return real_target(path, *a, **k)

    def drafter(path, *a, **k):
        seen["drafter"].append(str(Path(path).resolve()))
        return real_drafter(path, *a, **k)

    monkeypatch.setattr(ready.loading, "load_target", target)
    monkeypatch.setattr(ready.train.pipeline, "load_drafter", drafter)
    monkeypatch.setattr(row, "load_drafter", drafter)
    row.release_target()
    yield seen
    row.release_target()


def test_the_profile_resolves_for_every_declared_sweep_at_both_presets(capsys):
    for name in list_sweeps():
        for preset in ("qwen3_5_27b", "tiny"):
            assert sweeps_main([name, f"preset={preset}", "profile=gpu_shape", "--dry-run"]) == 0, (name, preset)
    out = capsys.readouterr().out
    assert "profile gpu_shape" in out
    cfg = load_sweep("ft_control", ["preset=qwen3_5_27b", "profile=gpu_shape"]).common
    assert cfg.target.pretrain is False and cfg.train.micro_batch_size == 4 and cfg.train.base.samples == 0
    assert int(cfg.regen.prompt_len) + int(cfg.regen.response_len) == 2048
    assert list(cfg.bench.suites) == ["humaneval", "heldout"] and cfg.eval.max_new_tokens == 128


def test_a_preset_without_pretraining_is_its_architecture_with_random_weights_and_the_embedded_tokenizer(tmp_path):
    cfg = jobs(tmp_path)["ar"]
    a, b = load_configured_target(cfg, progress=False), load_configured_target(cfg, progress=False)
    words = len(a.tokenizer)
    assert a.target.config.vocab_size == 4096 and a.target.config.num_hidden_layers == 8  # the preset's shape
    assert a.eos == a.tokenizer.eos_token_id  # as the embedded default target stops
    assert torch.equal(a.target.lm_head.weight, b.target.lm_head.weight)  # every process builds the same weights
    assert not a.target.lm_head.weight[words:].any() and a.target.lm_head.weight[:words].any()
    with torch.no_grad():  # greedy text stays inside the tokenizer
        logits = a.target(torch.tensor([[1, 2, 3, 4]])).logits
    assert int(logits.argmax(-1).max()) < words
    state = torch.get_rng_state()
    load_configured_target(cfg, progress=False)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left as it was


@pytest.mark.slow
def test_a_worker_builds_the_target_once_for_its_rows_and_every_row_logs_its_phases(tmp_path, counted_loads):
    cfgs = jobs(tmp_path)
    PHASES.take()
    row.prepare_shared(cfgs["ft"], ["ar", "dspark", "ft"], progress=False)
    shared = PHASES.take()
    assert {"target_load", "ar_generations", "regen"} <= set(shared), shared
    results = {m: row.run_variant(cfgs[m], m, progress=False) for m in ("ar", "dspark", "ft")}
    assert len(counted_loads["target"]) == 1 and row.LOADS["count"] >= 1  # prepare and three rows: one build

    for method, result in results.items():
        metrics, tags = result.metrics(), result.tags()
        assert "phase/target_load_s" not in metrics  # the worker's target served the row
        assert tags["ready.target_reused"] == "1"
        assert metrics["phase/eval_humaneval_s"] > 0 and metrics["phase/eval_heldout_s"] > 0
        assert not any(k.endswith("_peak_gb") for k in metrics)  # peaks are GPU memory: none on CPU
        assert tags["ready.engine"] == "eager+torch_ops" and tags["ready.engine_as_benchmarked"] == "0"
    ft = results["ft"].metrics()
    assert ft["phase/stage1_s"] > 0 and ft["phase/stage2_s"] > 0 and ft["phase/drafter_load_s"] > 0
    assert "phase/stage1_s" not in results["dspark"].metrics()


@pytest.mark.slow
def test_checkpoint_folders_at_a_preset_shape_load_once_per_process_and_once_per_row(tmp_path, counted_loads):
    folders = write_folders("tiny", tmp_path / "target", tmp_path / "dspark",
                            [f"artifacts_dir={tmp_path / 'artifacts'}", *SMALL[:3]], shard_gb=0.004)
    assert folders["target"]["shards"] > 1 and (tmp_path / "target" / "model.safetensors.index.json").is_file()
    assert "ready_drafter" not in json.loads((tmp_path / "dspark" / "config.json").read_text())  # a public folder
    counted_loads["target"].clear()
    cfgs = jobs(tmp_path, [f"target.source={tmp_path / 'target'}", f"drafter.checkpoint={tmp_path / 'dspark'}"])
    row.prepare_shared(cfgs["ft"], ["dspark", "ft", "ready"], progress=False)
    base = str((tmp_path / "dspark").resolve())
    per_row = {}
    for method in ("dspark", "ft", "ready"):
        before = len(counted_loads["drafter"])
        result = row.run_variant(cfgs[method], method, progress=False)
        per_row[method] = counted_loads["drafter"][before:].count(base)
        assert result.metrics()["phase/drafter_load_s"] > 0
    assert counted_loads["target"] == [str(tmp_path / "target")]  # the 27B folder: read once per worker
    # the DSpark folder: once per row that starts from it, and once more in the process's first trained row, whose
    # stage folders are named by the start drafter's weights (ready.train.pipeline: fingerprinted once per process)
    assert per_row == {"dspark": 1, "ft": 2, "ready": 1}, per_row


def test_a_sharded_target_folder_loads_as_the_single_file_one(tmp_path):
    from ready.target.checkpoint import save_target
    from ready.target.model import HybridLM
    from ready.target.config import preset_config

    model = HybridLM(preset_config("tiny")).eval()
    save_target(model, tmp_path / "one")
    save_target(model, tmp_path / "shards", shard_bytes=2_000_000)
    index = json.loads((tmp_path / "shards" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    a, b = load_target(tmp_path / "one"), load_target(tmp_path / "shards")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_phases_sum_their_entries_and_nest():
    rec = PhaseRecord()
    with rec.phase("stage1"):
        with rec.phase("inner"):
            pass
    with rec.phase("stage1"):
        pass
    with pytest.raises(RuntimeError):
        with rec.phase("eval_x"):
            raise RuntimeError("boom")
    assert rec.failed_in == "eval_x"
    phases = rec.take()
    assert phases["stage1"].calls == 2 and phases["stage1"].seconds >= phases["inner"].seconds
    assert set(phase_metrics(phases)) == {"phase/stage1_s", "phase/inner_s", "phase/eval_x_s"}
    assert rec.take() == {} and rec.failed_in is None


def test_a_row_out_of_gpu_memory_names_the_setting_to_lower(tmp_path):
    cfg = jobs(tmp_path)["ft"]
    err = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    for phase, knob in (("stage2", "train.micro_batch_size"), ("regen", "regen.batch_size"),
                        ("eval_humaneval", "eval.concurrency"), ("base", "drafter.checkpoint")):
        line = row.out_of_memory(cfg, "ft", phase, err)
        assert "\n" not in line and f"phase {phase!r}" in line and knob in line, line


@pytest.mark.cuda
def test_on_cuda_rows_log_peak_memory_and_evaluate_on_the_graphed_engine(tmp_path, counted_loads):
    cfgs = jobs(tmp_path, ["target.device=cuda", "target.dtype=bfloat16"])
    row.prepare_shared(cfgs["ft"], ["ar", "ft"], progress=False)
    result = row.run_variant(cfgs["ft"], "ft", progress=False)
    metrics, tags = result.metrics(), result.tags()
    for phase in ("stage1", "stage2", "drafter_load", "eval_humaneval", "eval_heldout"):
        assert metrics[f"phase/{phase}_peak_gb"] > 0, phase
    assert tags["ready.engine"] == "cuda_graphs+compiled_layers+triton_kernels"
    assert tags["ready.engine_as_benchmarked"] == "1" and tags["ready.engine_drafter_dtype"] == "bfloat16"
    assert len(counted_loads["target"]) == 1


@pytest.mark.slow
def test_a_sweep_run_without_polars_gives_a_table_2_here_from_its_store_moved_beside_its_artifacts(
        tmp_path, monkeypatch):
    """The GPU machine runs the sweep with --no-report and no polars (its wheel does not fit the transfer); the
    store and its mlruns folder come back to another path, and the tables are built there."""
    import shutil
    import sys

    from sweeps.relocate import main as relocate_main
    from sweeps.tracking import client

    there = tmp_path / "device-out"
    there.mkdir()
    monkeypatch.chdir(there)  # MLflow puts a sqlite store's artifacts in <working directory>/mlruns
    polars = sys.modules.get("polars")  # an earlier test may have imported it: put that very module back
    monkeypatch.setitem(sys.modules, "polars", None)  # `import polars` fails, as on the GPU image
    args = ["ft_control", "preset=tiny", "profile=gpu_shape", f"artifacts_dir={tmp_path / 'artifacts'}", *SMALL,
            "--no-report", "--quiet", "--tracking-uri", f"sqlite:///{there / 'mlflow.db'}", "--run-dir", str(there / "run")]
    assert sweeps_main(args) == 0
    if polars is None:
        monkeypatch.delitem(sys.modules, "polars")
    else:
        monkeypatch.setitem(sys.modules, "polars", polars)
    monkeypatch.chdir(tmp_path)
    here = tmp_path / "brought-back"
    shutil.copytree(there, here)
    shutil.rmtree(there)  # the device's paths are gone here
    uri = f"sqlite:///{here / 'mlflow.db'}"
    runs = client(uri).search_runs([client(uri).get_experiment_by_name("ready-ft_control").experiment_id])
    children = [r for r in runs if r.data.tags.get("ready.kind") == "variant"]
    parent = next(r for r in runs if r.data.tags.get("ready.kind") == "sweep")
    assert len(children) == 5 and all(r.info.status == "FINISHED" for r in children)
    assert {"prepare/target_load_s", "prepare/regen_s", "prepare/ar_generations_s"} <= set(parent.data.metrics)
    for r in children:
        assert r.data.metrics["phase/eval_humaneval_s"] > 0 and r.data.tags["ready.target_reused"] == "1"
        assert r.data.tags["ready.engine"] == "eager+torch_ops"
    assert relocate_main([str(here / "mlflow.db")]) == 0
    from sweeps.phases import phase_rows

    headers, table = phase_rows(uri, "ft_control")
    assert table[0][0] == "(shared builds)" and len(table) == 6 and "stage1 s (GB)" in headers
    from reports.build import build_reports

    files = build_reports(uri, ["ft_control"], tmp_path / "tables", echo=None)
    assert any(f.name.startswith("table2") and f.suffix == ".md" for f in files), files


def test_a_moved_store_reads_its_artifacts_only_once_relocated(tmp_path, monkeypatch):
    import shutil

    from mlflow.tracking import MlflowClient

    from sweeps.relocate import moved, relocate

    there = tmp_path / "there"
    there.mkdir()
    monkeypatch.chdir(there)
    c = MlflowClient(tracking_uri=f"sqlite:///{there / 'mlflow.db'}")
    run = c.create_run(c.create_experiment("x"))
    (tmp_path / "evaluation.json").write_text("{}")
    c.log_artifact(run.info.run_id, str(tmp_path / "evaluation.json"))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(there, tmp_path / "here")
    shutil.rmtree(there)
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'here' / 'mlflow.db'}")
    with pytest.raises(Exception):
        c.download_artifacts(run.info.run_id, "evaluation.json", str(tmp_path))
    assert relocate(tmp_path / "here" / "mlflow.db") >= 2  # the experiment's location and the run's
    assert Path(c.download_artifacts(run.info.run_id, "evaluation.json", str(tmp_path))).read_text() == "{}"
    assert moved("file:///a/b/mlruns/1/x/artifacts", Path("/c")) == "file:///c/1/x/artifacts"
    assert moved("s3://bucket/elsewhere", Path("/c")) is None
