"""Artifacts are verified, never trusted (issue 15).

The DONE marker records each file's size and sha256; a truncated, overwritten or deleted file
of the cache's own artifacts is rebuilt with one line on stderr (and the rebuild is bit-identical,
so every number computed from it is the same), while a bad file in a folder the user supplied is
one clear error. A target or drafter with NaN weights never yields a FINISHED run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fault_helpers import SWEEP, Smoke, load, smoke_cache, store_copy
from ready import artifacts
from ready.artifacts import DONE, ArtifactError, atomic_dir, cached, check_folder, intact, verify
from ready.drafter import DrafterError, load_drafter
from ready.target import TargetError, load_target
from sweeps import tracking
from sweeps.run import main


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    """Same size, other bytes (the safetensors header survives: only the tensor data changes)."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little") if path.suffix == ".safetensors" else 0
    data[start:] = bytes((b ^ 0x5A) for b in data[start:])
    path.write_bytes(bytes(data))


def delete(path: Path) -> None:
    path.unlink()


FAULTS = {"truncate": truncate, "garbage": garbage, "delete": delete}


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# The marker on toy folders


def build_two_files(tmp: Path) -> None:
    (tmp / "a.bin").write_bytes(b"x" * 1000)
    (tmp / "sub").mkdir()
    (tmp / "sub" / "b.json").write_text('{"k": 1}')


def test_the_marker_records_every_files_size_and_digest_and_the_spec(tmp_path: Path) -> None:
    folder = cached(tmp_path, "toy", {"v": 1}, build_two_files)
    meta = json.loads((folder / DONE).read_text())
    assert meta["spec"] == folder.name
    assert set(meta["files"]) == {"a.bin", "sub/b.json", "spec.json"}
    assert meta["files"]["a.bin"] == {"size": 1000, "sha256": hashlib.sha256(b"x" * 1000).hexdigest()}
    assert verify(folder, folder.name) is None
    assert verify(folder, "0" * 12).startswith("built from spec")


@pytest.mark.parametrize("fault, expected", [("truncate", "500 bytes, the marker recorded 1000"),
                                             ("garbage", "content differs"), ("delete", "missing")])
def test_each_fault_is_found_and_the_cache_rebuilds_with_one_line(tmp_path: Path, capsys, fault: str,
                                                                 expected: str) -> None:
    builds = []
    folder = cached(tmp_path, "toy", {"v": 1}, lambda tmp: builds.append(1) or build_two_files(tmp))
    FAULTS[fault](folder / "a.bin")
    assert expected in verify(folder)
    capsys.readouterr()
    assert cached(tmp_path, "toy", {"v": 1}, lambda tmp: builds.append(1) or build_two_files(tmp)) == folder
    line = one_line(capsys.readouterr().err)
    assert f"artifact toy/{folder.name} failed verification (a.bin: " in line and line.endswith("rebuilding it")
    assert len(builds) == 2 and verify(folder) is None and (folder / "a.bin").read_bytes() == b"x" * 1000


def test_a_garbled_marker_is_not_trusted(tmp_path: Path, capsys) -> None:
    folder = cached(tmp_path, "toy", {"v": 1}, build_two_files)
    (folder / DONE).write_text("{not json")
    assert not intact(folder)
    assert "DONE: not a manifest" in one_line(capsys.readouterr().err)


def test_a_marker_from_before_manifests_is_upgraded_once(tmp_path: Path, capsys) -> None:
    folder = cached(tmp_path, "toy", {"v": 1}, build_two_files)
    (folder / DONE).write_text("ok\n")
    assert intact(folder)
    assert "predates content digests; recording them now" in one_line(capsys.readouterr().err)
    assert json.loads((folder / DONE).read_text())["files"]["a.bin"]["size"] == 1000
    assert intact(folder) and capsys.readouterr().err == ""


def test_a_user_folder_that_changed_is_one_error_never_a_rebuild(tmp_path: Path) -> None:
    with atomic_dir(tmp_path / "ckpt") as tmp:
        build_two_files(tmp)
    check_folder(tmp_path / "ckpt", "drafter checkpoint")
    garbage(tmp_path / "ckpt" / "sub" / "b.json")
    with pytest.raises(ArtifactError, match=r"ckpt: sub/b.json: content differs .*expected the drafter checkpoint"):
        check_folder(tmp_path / "ckpt", "drafter checkpoint")
    assert (tmp_path / "ckpt" / "sub" / "b.json").exists()  # left as it is
    check_folder(tmp_path / "ckpt", "drafter checkpoint", patterns=("*.bin",))  # a hand-edited JSON: not checked
    truncate(tmp_path / "ckpt" / "a.bin")
    with pytest.raises(ArtifactError, match=r"a.bin: 500 bytes.*or delete .*ckpt/DONE if the change was on purpose"):
        check_folder(tmp_path / "ckpt", "drafter checkpoint", patterns=("*.bin",))
    check_folder(tmp_path, "anything")  # no marker (e.g. a Hugging Face download): nothing to compare


def test_each_file_is_hashed_once_per_process_until_it_changes(tmp_path: Path, monkeypatch) -> None:
    folder = cached(tmp_path, "toy", {"v": 1}, build_two_files)
    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(artifacts.hashlib, "sha256", lambda *a: hashed.append(1) or real(*a))
    for _ in range(3):
        assert verify(folder) is None
    assert hashed == []  # digests of the files just written were kept when the marker was made
    garbage(folder / "a.bin")
    assert verify(folder) and verify(folder) and len(hashed) == 1


# ---------------------------------------------------------------------------------------------
# The same faults on a smoke cache (tokenizer, target, AR generations, regenerated data, base
# drafter, stage folders of one ReaDy row)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="module")
def smoke(base: Path) -> Smoke:
    return smoke_cache(base)


def _one(pattern: str, root: Path) -> Path:
    found = sorted(root.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


def _rebuild(kind: str, smoke: Smoke) -> None:
    """Ask for the artifact the way the pipeline does (which rebuilds it when needed)."""
    from ready.data import ensure_default_target
    from ready.loading import load_configured_target
    from ready.train import ensure_base_drafter, train_variant
    from sweeps.row import _suites, ar_generations
    from ready.train.regen import build_regen_data

    cfg = smoke.cfg
    if kind == "target":
        ensure_default_target(cfg, progress=False)
        return
    loaded = load_configured_target(cfg, progress=False)
    if kind == "ar":
        ar_generations(cfg, loaded, _suites(cfg, loaded.tokenizer), progress=False)
    elif kind == "regen":
        build_regen_data(cfg, loaded.target, loaded.tokenizer, progress=False)
    elif kind == "drafter_base":
        ensure_base_drafter(cfg, loaded.target, loaded.tokenizer, progress=False)
    elif kind == "stage":
        train_variant(cfg, loaded.target, loaded.tokenizer, None, smoke.artifacts / "stages", progress=False)


def _content(path: Path) -> object:
    """What a file means for the numbers: its bytes, or for AR generations the tokens (not the timing)."""
    if path.name == "generations.json":
        return {b: [g["tokens"] for g in gens] for b, gens in json.loads(path.read_text()).items()}
    return sha(path)


@pytest.mark.parametrize("kind, folder, name, fault", [
    ("target", "target/*", "model.safetensors", "garbage"),
    ("stage", "stages/stage1-*", "drafter/model.safetensors", "truncate"),
    ("drafter_base", "drafter_base/*", "drafter/model.safetensors", "delete"),
    ("stage", "stages/stage2-*", "drafter/model.safetensors", "garbage"),
    ("ar", "ar/*", "generations.json", "truncate"),
    ("regen", "regen/*", "data.pt", "garbage"),
])
def test_a_corrupted_smoke_artifact_is_rebuilt_identically_with_one_line(smoke: Smoke, capfd, kind: str, folder: str,
                                                                        name: str, fault: str) -> None:
    artifact = smoke.regen if kind == "regen" else _one(folder, smoke.artifacts)
    before = _content(artifact / name)
    FAULTS[fault](artifact / name)
    capfd.readouterr()
    _rebuild(kind, smoke)
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and f"failed verification ({name}: " in err[0] and err[0].endswith("rebuilding it"), err
    assert verify(artifact, artifact.name.split("-")[-1]) is None
    assert _content(artifact / name) == before  # the same weights / tokens again: the same numbers


def test_user_checkpoints_with_bad_files_are_one_error_naming_the_file(smoke: Smoke, tmp_path: Path) -> None:
    target_dir = _one("target/*", smoke.artifacts)
    drafter_dir = _one("drafter_base/*", smoke.artifacts) / "drafter"
    target, _ = load(smoke.cfg)

    t = shutil.copytree(target_dir, tmp_path / "t")
    (t / DONE).unlink()  # like a Hugging Face download: nothing recorded to compare with
    truncate(t / "model.safetensors")
    with pytest.raises(TargetError, match=r"t/model.safetensors: not a readable safetensors file"):
        load_target(t)
    (t / "config.json").write_text("{oops")
    with pytest.raises(TargetError, match=r"t/config.json: not readable JSON"):
        load_target(t)

    d = shutil.copytree(drafter_dir, tmp_path / "d")
    garbage(d / "model.safetensors")
    with pytest.raises(DrafterError, match=r"d: model.safetensors: content differs from the sha256"):
        load_drafter(d, target)
    (d / DONE).unlink()
    truncate(d / "model.safetensors")
    with pytest.raises(DrafterError, match=r"d/model.safetensors: not a readable safetensors file"):
        load_drafter(d, target)
    (d / "config.json").write_text("[1, 2")
    with pytest.raises(DrafterError, match=r"d/config.json: not readable JSON"):
        load_drafter(d, target)


def _nan_copy(src: Path, dest: Path, weights: str) -> Path:
    """A copy of a checkpoint folder with one tensor set to NaN and no DONE marker (a user's file)."""
    out = shutil.copytree(src, dest)
    (out / DONE).unlink()
    state = load_file(str(out / weights))
    name = sorted(k for k, v in state.items() if v.is_floating_point() and v.ndim == 2)[0]
    state[name] = torch.full_like(state[name], float("nan"))
    save_file(state, str(out / weights), metadata={"format": "pt"})
    return out


def _sweep(smoke: Smoke, base: Path, tmp_path: Path, *overrides: str) -> tuple[int, str]:
    uri = store_copy(base, tmp_path / "store")
    args = [SWEEP, "profile=smoke", f"artifacts_dir={smoke.artifacts}", *overrides, "--tracking-uri", uri,
            "--run-dir", str(tmp_path / "run"), "--no-report", "--quiet"]
    return main(args), uri


def _children(uri: str) -> list:
    c = tracking.client(uri)
    exp = c.get_experiment_by_name(f"ready-{SWEEP}")
    if exp is None:
        return []
    return list(c.search_runs([exp.experiment_id], filter_string="tags.`ready.kind` = 'variant'"))


def test_a_target_with_nan_weights_stops_the_sweep_with_one_line_and_no_run(smoke: Smoke, base: Path,
                                                                            tmp_path: Path, capsys) -> None:
    bad = _nan_copy(_one("target/*", smoke.artifacts), tmp_path / "nan-target", "model.safetensors")
    capsys.readouterr()
    code, uri = _sweep(smoke, base, tmp_path, f"target.source={bad}", "target.pretrain=false")
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(f"error: target {bad}: weight ") and "NaN or Inf" in errors[0]
    assert _children(uri) == []


def test_a_drafter_checkpoint_with_nan_weights_fails_every_drafting_row_never_finished(smoke: Smoke, base: Path,
                                                                                      tmp_path: Path, capsys) -> None:
    bad = _nan_copy(_one("drafter_base/*", smoke.artifacts) / "drafter", tmp_path / "nan-drafter", "model.safetensors")
    code, uri = _sweep(smoke, base, tmp_path, f"drafter.checkpoint={bad}")
    out = capsys.readouterr()
    runs = _children(uri)
    assert code == 1
    ar = [r for r in runs if r.data.tags["ready.method"] == "ar"]
    drafting = [r for r in runs if r.data.tags["ready.method"] != "ar"]
    assert len(ar) == 1 and ar[0].info.status == "FINISHED"  # AR never touches the drafter
    assert len(drafting) == 5 and all(r.info.status == "FAILED" for r in drafting)  # DSpark, FT, placebo, pre, post
    assert all("holds NaN or Inf values" in r.data.tags["ready.error"] for r in drafting)
    failed = [ln for ln in out.err.splitlines() if ln.startswith("[sweeps] FAILED")]
    assert len(failed) == len(drafting) and "Traceback" not in out.err
