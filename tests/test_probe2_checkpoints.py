"""The second adversarial probe's faults in checkpoints, weights and foreign config files (issue 75,
items 2, 4, 5 and the file cases of 9), each run as the probe ran it: the command, its exit status,
its one line, and what is (not) loaded, written or lost.

G below is the probe's `python -m sweeps.commands.generate --target T --drafter D --method dspark ...` over a
tiny target T and a DSpark drafter folder D as SpecForge writes one (config.json with dflash_config +
model.safetensors); E is `python -m sweeps.commands.export SRC OUT`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from fault_helpers import errors
from test_probe_faults import tiny_checkpoint

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared machine
INDEX = "model.safetensors.index.json"
PROMPT = ["--prompt-ids", "1,2,3", "--max-new-tokens", "4", "target.device=cpu", "--json"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """base/target: a tiny hybrid target with its tokenizer; base/own: a drafter folder this tool wrote
    for it; base/foreign: the same drafter as SpecForge would leave it (no manifest, no ready blocks)."""
    from ready.config import DrafterConfig, ReaderConfig
    from ready.drafter import DSparkDrafter, save_drafter
    from ready.target import load_target

    root = tmp_path_factory.mktemp("probe2")
    tiny_checkpoint(root / "target")
    (root / "target" / "DONE").unlink()  # a user's folder: nothing but its own files decides what loads
    target = load_target(root / "target")
    torch.manual_seed(0)
    drafter = DSparkDrafter(DrafterConfig(proposals=3, num_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                          head_dim=16, intermediate_size=32, mask_token_id=1, context_layers=[0, 2],
                                          layer_space="model", head="vanilla", head_rank=4),
                            ReaderConfig(enabled=False), target)
    save_drafter(drafter, root / "own")
    foreign = Path(shutil.copytree(root / "own", root / "foreign"))
    (foreign / "DONE").unlink()
    edit_json(foreign / "config.json", lambda c: c.pop("ready_drafter"))
    return root


def edit_json(file: Path, edit: Callable[[dict], Any]) -> None:
    raw = json.loads(file.read_text())
    edit(raw)
    file.write_text(json.dumps(raw, indent=1))


def copy(base: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base / name, tmp_path / name, symlinks=True))


def generate(capsys, target: Path, drafter: Path | None = None, *extra: str) -> tuple[int, list[str], str]:
    """G (with --method ngram when there is no drafter): (exit status, its error lines, its stdout)."""
    from sweeps.commands.generate import main

    args = ["--target", str(target), *(["--drafter", str(drafter), "--method", "dspark"] if drafter else
                                       ["--method", "ngram"]), *PROMPT, *extra]
    code = main(args)
    out = capsys.readouterr()
    return code, errors(out.err), out.out


def shard(folder: Path, sub: str = "shards") -> list[Path]:
    """model.safetensors split into two shards under folder/sub, named by an index (the probe's layout)."""
    state = load_file(str(folder / "model.safetensors"))
    names = sorted(state)
    (folder / sub).mkdir()
    files = [folder / sub / "part1.safetensors", folder / sub / "part2.safetensors"]
    parts = [names[: len(names) // 2], names[len(names) // 2:]]
    for file, keys in zip(files, parts):
        save_file({k: state[k] for k in keys}, str(file), metadata={"format": "pt"})
    (folder / "model.safetensors").unlink()
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {
        k: f.relative_to(folder).as_posix() for f, keys in zip(files, parts) for k in keys}}))
    return files


def rewrite(file: Path, change: Callable[[dict], Any]) -> None:
    state = load_file(str(file))
    change(state)
    save_file(state, str(file), metadata={"format": "pt"})


# ---------------------------------------------------------------------------------------------
# 2. A stale row reused: a shard in a sub-folder was not part of the checkpoint's identity


def test_a_shard_in_a_sub_folder_enters_the_hash_of_every_row_that_starts_from_it(base: Path, tmp_path: Path) -> None:
    from sweeps.spec import load_sweep

    folder = copy(base, "foreign", tmp_path)
    part1, _ = shard(folder)

    def hashes() -> list[tuple[str, str]]:
        sweep = load_sweep("inject_pos", ["profile=smoke", f"drafter.checkpoint={folder}"])
        return [(j.variant.method, j.config_hash) for j in sweep.jobs()]

    before = hashes()
    rewrite(part1, lambda s: s.update({k: v * 2 for k, v in s.items()}))  # the probe scaled that shard's weights
    after = hashes()
    assert [m for m, _ in after] == [m for m, _ in before]
    changed = {m: b != a for (m, b), (_, a) in zip(before, after)}
    assert changed == {m: m != "ar" for m in changed}  # every drafting row anew; AR reads no drafter


def test_a_drafter_with_shards_in_a_sub_folder_loads_them(base: Path, tmp_path: Path) -> None:
    from ready.drafter import load_drafter
    from ready.target import load_target

    target = load_target(base / "target")
    folder = copy(base, "foreign", tmp_path)
    want = load_file(str(folder / "model.safetensors"))
    shard(folder)
    got = load_drafter(folder, target).state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_targets_identity_covers_a_shard_in_a_sub_folder(base: Path, tmp_path: Path) -> None:
    from ready.loading import weights_id

    folder = copy(base, "target", tmp_path)
    part1, _ = shard(folder, "weights")
    before = weights_id(folder)
    rewrite(part1, lambda s: s.update({k: v * 2 for k, v in s.items()}))
    assert weights_id(folder) != before


def outside(how: str, folder: Path, tmp_path: Path) -> str:
    """Point the index's first shard outside `folder` the probe's three ways; returns the entry it now holds."""
    foreign = tmp_path / "foreign-weights" / "model.safetensors"
    foreign.parent.mkdir()
    index = json.loads((folder / INDEX).read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    shutil.copy(folder / first, foreign)
    if how == "symlink":  # the entry is as before; the file is a link out of the folder
        (folder / first).unlink()
        (folder / first).symlink_to(foreign)
        return first
    entry = "../foreign-weights/model.safetensors" if how == "dotdot" else str(foreign)
    index["weight_map"] = {k: entry if v == first else v for k, v in index["weight_map"].items()}
    (folder / INDEX).write_text(json.dumps(index))
    return entry


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
@pytest.mark.parametrize("kind", ["drafter", "target"])
def test_an_index_entry_that_leads_out_of_the_folder_is_refused(kind: str, how: str, base: Path, tmp_path: Path,
                                                                 capsys) -> None:
    folder = copy(base, "foreign" if kind == "drafter" else "target", tmp_path)
    shard(folder)
    entry = outside(how, folder, tmp_path)
    if kind == "drafter":
        code, lines, out = generate(capsys, base / "target", folder)
    else:
        code, lines, out = generate(capsys, folder)
    assert code == 2 and out == "" and len(lines) == 1
    (line,) = lines
    assert line.startswith(f"error: {folder / INDEX}: weight_map['")
    if how == "symlink":
        assert f"] is '{entry}', a symbolic link to {(tmp_path / 'foreign-weights' / 'model.safetensors').resolve()}, " \
               f"outside {folder}; expected a file inside the checkpoint folder" in line
    else:
        assert line.endswith(f"] is '{entry}', outside {folder}; expected a file inside the checkpoint folder (its "
                             "identity and its weights are that folder's)")


def test_the_identity_of_a_drafter_whose_index_leads_out_is_refused_too(base: Path, tmp_path: Path) -> None:
    """A row's hash reads the drafter's identity first (sweeps.spec.checkpoint_id): a config error there."""
    from ready.config import ConfigError
    from sweeps.spec import checkpoint_id

    folder = copy(base, "foreign", tmp_path)
    shard(folder)
    entry = outside("dotdot", folder, tmp_path)
    with pytest.raises(ConfigError) as e:
        checkpoint_id(str(folder))
    assert str(e.value).startswith(f"bad value at key 'drafter.checkpoint': {folder / INDEX}: weight_map[")
    assert str(e.value).endswith(f"] is '{entry}', outside {folder}; expected a file inside the checkpoint folder (its "
                                 "identity and its weights are that folder's)")


def test_a_hugging_face_cache_snapshot_links_into_its_own_blobs(base: Path, tmp_path: Path, capsys) -> None:
    """models--org--name/snapshots/REV/* are links to ../../blobs/SHA: that folder's own files."""
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in (base / "target").iterdir():
        blob = repo / "blobs" / f"blob-{file.name}"
        shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    code, lines, out = generate(capsys, snapshot)
    assert code == 0 and lines == [] and json.loads(out)["results"][0]["new_tokens"] == 4


# ---------------------------------------------------------------------------------------------
# 4. Invalid weights loaded without a word


FLOATS = "F64, F32, F16, BF16, F8_E4M3, F8_E5M2"


@pytest.mark.parametrize("kind, tensor, dtype, shown", [
    ("drafter", "fc.weight", torch.int64, "I64"),
    ("drafter", "markov_head.markov_w1.weight", torch.bool, "BOOL"),
    ("target", "model.norm.weight", torch.int32, "I32"),
    ("target", "lm_head.weight", torch.bool, "BOOL"),
])
def test_an_integer_or_boolean_tensor_is_refused_naming_it(kind: str, tensor: str, dtype: torch.dtype, shown: str,
                                                           base: Path, tmp_path: Path, capsys) -> None:
    folder = copy(base, "foreign" if kind == "drafter" else "target", tmp_path)
    rewrite(folder / "model.safetensors", lambda s: s.update({tensor: s[tensor].to(dtype)}))
    code, lines, out = generate(capsys, *((base / "target", folder) if kind == "drafter" else (folder,)))
    assert code == 2 and out == ""
    assert lines == [f"error: {folder / 'model.safetensors'}: tensor {tensor} has dtype {shown}; expected "
                     f"floating-point weights ({FLOATS}): an integer or boolean tensor is no weight"]


@pytest.mark.parametrize("kind", ["drafter", "target"])
def test_a_tensor_in_two_shards_is_refused_naming_both_files(kind: str, base: Path, tmp_path: Path, capsys) -> None:
    folder = copy(base, "foreign" if kind == "drafter" else "target", tmp_path)
    part1, part2 = shard(folder)
    name = sorted(load_file(str(part1)))[0]
    rewrite(part2, lambda s: s.update({name: torch.zeros_like(load_file(str(part1))[name])}))  # another value
    code, lines, out = generate(capsys, *((base / "target", folder) if kind == "drafter" else (folder,)))
    assert code == 2 and out == ""
    assert lines == [f"error: tensor {name} is in both {part1} and {part2}; expected each tensor once (one of two "
                     "copies would silently win)"]


@pytest.mark.parametrize("kind", ["drafter", "target"])
def test_inf_weights_are_refused_like_nan(kind: str, base: Path, tmp_path: Path, capsys) -> None:
    folder = copy(base, "foreign" if kind == "drafter" else "target", tmp_path)
    tensor = "fc.weight" if kind == "drafter" else "model.norm.weight"

    def inf(state: dict) -> None:
        state[tensor].view(-1)[0] = float("inf")

    rewrite(folder / "model.safetensors", inf)
    code, lines, out = generate(capsys, *((base / "target", folder) if kind == "drafter" else (folder,)))
    assert code == 2 and out == ""
    if kind == "drafter":
        assert lines == [f"error: {folder / 'model.safetensors'}: tensor {tensor} holds NaN or Inf values; expected "
                         "finite weights"]
    else:
        assert lines == [f"error: target {folder}: weight {tensor} holds NaN or Inf values; expected finite weights "
                         "(a broken or corrupted checkpoint)"]


# ---------------------------------------------------------------------------------------------
# 5. Export


def export(capsys, *args: str) -> tuple[int, list[str], str]:
    """E: (exit status, its error lines, the rest of its stderr and stdout)."""
    from sweeps.commands.export import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, errors(out.err), out.err + out.out


def no_leftovers(out: Path) -> bool:
    """Neither OUT nor a temporary folder of a write to it."""
    return not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))


def test_export_refuses_a_dtype_that_cannot_hold_a_weight(base: Path, tmp_path: Path, capsys) -> None:
    from ready.drafter import load_drafter, save_drafter
    from ready.target import load_target

    drafter = load_drafter(base / "own", load_target(base / "target"))
    with torch.no_grad():
        drafter.fc.weight[0, :8] = 1e6  # the probe's weights of 1e6: Inf in float16
    src = save_drafter(drafter, tmp_path / "big")
    out = tmp_path / "out"
    code, lines, _ = export(capsys, str(src), str(out), "--dtype", "float16")
    assert code == 2 and no_leftovers(out)
    assert lines == ["error: --dtype float16: tensor fc.weight holds values up to |1e+06|, beyond float16's largest "
                     "6.55e+04; expected a dtype that represents every value (e.g. float32, or bfloat16)"]
    assert export(capsys, str(src), str(out), "--dtype", "bfloat16")[0] == 0  # a dtype that holds it


def test_export_never_replaces_another_tools_checkpoint_folder(base: Path, tmp_path: Path, capsys) -> None:
    theirs = copy(base, "foreign", tmp_path)  # config.json + model.safetensors, as SpecForge saves a drafter
    before = {p.name: p.read_bytes() for p in theirs.iterdir()}
    code, lines, _ = export(capsys, str(base / "own"), str(theirs))
    assert code == 2 and lines == [
        f"error: {theirs}: exists and was not written by this export (holds ['config.json', 'model.safetensors']); "
        "expected a new folder or an earlier export left as it was (nothing else is replaced)"]
    assert {p.name: p.read_bytes() for p in theirs.iterdir()} == before


def test_export_never_replaces_a_sweeps_drafter_or_a_changed_export(base: Path, tmp_path: Path, capsys) -> None:
    sweeps_drafter = copy(base, "own", tmp_path)  # written by save_drafter, not by the export
    assert export(capsys, str(base / "foreign"), str(sweeps_drafter))[0] == 2
    out = tmp_path / "out"
    assert export(capsys, str(base / "own"), str(out))[0] == 0
    assert export(capsys, str(base / "foreign"), str(out))[0] == 0  # an earlier export, as it was: replaced
    (out / "notes.txt").write_text("mine")
    code, lines, _ = export(capsys, str(base / "own"), str(out))
    assert code == 2 and len(lines) == 1 and "exists and was not written by this export" in lines[0]
    assert (out / "notes.txt").read_text() == "mine"


def test_export_to_a_file_a_symlink_or_under_a_file_is_one_line(base: Path, tmp_path: Path, capsys) -> None:
    file = tmp_path / "out.txt"
    file.write_text("mine")
    assert export(capsys, str(base / "own"), str(file))[:2] == (
        2, [f"error: {file}: a file; expected a new folder or one this export wrote"])
    link = tmp_path / "link"
    elsewhere = copy(base, "foreign", tmp_path)
    link.symlink_to(elsewhere, target_is_directory=True)
    assert export(capsys, str(base / "own"), str(link))[:2] == (
        2, [f"error: {link}: a symbolic link; expected a new folder or one this export wrote (a link is not followed: "
            "its target would be replaced)"])
    code, lines, _ = export(capsys, str(base / "own"), str(file / "out"))
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {file / 'out'}: cannot write the export (")
    assert file.read_text() == "mine" and sorted(p.name for p in elsewhere.iterdir()) == ["config.json",
                                                                                            "model.safetensors"]


@pytest.mark.parametrize("edit, shown", [
    (lambda c: c.update(ready_drafter=[1]), "ready_drafter is [1]; expected an object"),
    (lambda c: c["ready_drafter"].update(drafter=["context_window", 8]),
     "ready_drafter.drafter is ['context_window', 8]; expected an object"),
])
def test_export_of_a_ready_drafter_block_that_is_a_list_is_one_line(edit, shown: str, base: Path, tmp_path: Path,
                                                                    capsys) -> None:
    src = copy(base, "own", tmp_path)
    (src / "DONE").unlink()  # hand-edited: no manifest to catch the change first
    edit_json(src / "config.json", edit)
    out = tmp_path / "out"
    code, lines, _ = export(capsys, str(src), str(out))
    assert code == 2 and no_leftovers(out) and lines == [f"error: {src / 'config.json'}: {shown}"]


@pytest.mark.parametrize("status", ["FAILED", "RUNNING"])
def test_export_of_a_run_that_did_not_finish_is_refused_or_warned(status: str, base: Path, tmp_path: Path, capsys,
                                                                  tmp_path_factory) -> None:
    from mlflow.tracking import MlflowClient

    from fault_helpers import store_copy

    uri = store_copy(tmp_path_factory.getbasetemp(), tmp_path / "store")
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("export-probe", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(exp)
    (tmp_path / "evaluation.json").write_text(json.dumps({"method": "ready", "resolved": {"drafter_dir": str(base / "own")}}))
    client.log_artifact(run.info.run_id, str(tmp_path / "evaluation.json"))
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)
    out = tmp_path / "out"
    rid = run.info.run_id
    code, lines, _ = export(capsys, rid, str(out), "--tracking-uri", uri)
    assert code == 2 and no_leftovers(out) and lines == [
        f"error: run {rid!r} is {status}, not FINISHED; expected a finished sweep row (or --allow-unfinished to "
        "export its drafter anyway)"]
    code, lines, said = export(capsys, rid, str(out), "--tracking-uri", uri, "--allow-unfinished")
    assert code == 0 and lines == [] and (out / "model.safetensors").is_file()
    assert f"warning: run {rid!r} is {status}, not FINISHED: exporting the drafter it left" in said


# ---------------------------------------------------------------------------------------------
# 9. Hand-edited foreign files: tracebacks and hangs


def pop(key: str) -> Callable[[dict], Any]:
    return lambda c: c.pop(key)


def dflash(**fields: Any) -> Callable[[dict], Any]:
    return lambda c: c["dflash_config"].update(fields)


DRAFTER_CONFIGS = [  # (edit of config.json, what the one line says after "DIR/config.json: ")
    (lambda c: c.update(hidden_size="abc"), "hidden_size is 'abc'; expected an integer >= 1"),
    (lambda c: c.update(num_attention_heads=0), "num_attention_heads is 0; expected an integer >= 1"),
    (pop("num_attention_heads"), "num_attention_heads is missing; expected an integer >= 1"),
    (lambda c: c.update(num_key_value_heads="1"), "num_key_value_heads is '1'; expected an integer >= 1"),
    (lambda c: c.update(num_key_value_heads=3),
     "num_attention_heads is 2, not a multiple of num_key_value_heads 3; expected whole query groups"),
    (dflash(target_layer_ids=5), "dflash_config.target_layer_ids = 5; expected ascending target layer ids in 0..3"),
    (lambda c: c.update(rms_norm_eps="tiny"), "rms_norm_eps is 'tiny'; expected a finite number > 0"),
    (lambda c: c.update(rms_norm_eps=-1e-6), "rms_norm_eps is -1e-06; expected a finite number > 0"),
    (pop("block_size"), "block_size is missing; expected an integer >= 2"),
    (lambda c: c.update(head_dim=15), "head_dim is 15; expected an even integer >= 2 (the rotary turns pairs)"),
    (lambda c: c.update(intermediate_size=-5), "intermediate_size is -5; expected an integer >= 1"),
    (lambda c: c.update(num_hidden_layers=0), "num_hidden_layers is 0; expected an integer >= 1"),
    (lambda c: c.update(rope_theta="big"), "rope_theta is 'big'; expected a finite number > 0"),
    (lambda c: c.update(rope_scaling=[1]), "rope_scaling is [1]; expected an object"),
    (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": "x", "original_max_position_embeddings": 64}),
     "rope_scaling.factor is 'x'; expected a finite number > 0"),
    (lambda c: c.update(layer_types="full_attention"), "layer_types is 'full_attention'; expected a list of strings"),
    (lambda c: c.update(architectures=5), "architectures is 5; expected a list of strings"),
    (dflash(mask_token_id="x"), "dflash_config.mask_token_id is 'x'; expected a token id of the target (0..7)"),
    (dflash(markov_rank="x"), "dflash_config.markov_rank is 'x'; expected an integer"),
    (dflash(enable_confidence_head="yes"), "dflash_config.enable_confidence_head is 'yes'; expected true or false"),
    (lambda c: c.update(ready_drafter=[1]), "ready_drafter is [1]; expected an object"),
]


@pytest.mark.parametrize("edit, shown", DRAFTER_CONFIGS)
def test_a_hand_edited_drafter_config_is_refused_naming_the_field(edit, shown: str, base: Path, tmp_path: Path,
                                                                  capsys) -> None:
    folder = copy(base, "foreign", tmp_path)
    edit_json(folder / "config.json", edit)
    code, lines, out = generate(capsys, base / "target", folder)
    assert code == 2 and out == ""
    assert lines == [f"error: {folder / 'config.json'}: {shown}"]


@pytest.mark.parametrize("index, shown", [
    ({"weight_map": ["part1.safetensors"]}, "weight_map is ['part1.safetensors']; expected an object naming each "
                                            "tensor's file, e.g. {{\"lm_head.weight\": \"model-00001-of-00002.safetensors\"}}"),
    ({"weight_map": {"fc.weight": 5}}, "weight_map['fc.weight'] is 5; expected a file name inside {folder}"),
    ({"weight_map": {"fc.weight": "nowhere.safetensors"}},
     "weight_map['fc.weight'] is 'nowhere.safetensors', but {folder}/nowhere.safetensors is missing; expected the "
     "file beside the index"),
    ([1, 2], "holds a JSON list; expected a safetensors index with a 'weight_map' object (a JSON object)"),
])
@pytest.mark.parametrize("kind", ["drafter", "target"])
def test_a_hand_edited_index_is_refused_naming_the_field(kind: str, index: Any, shown: str, base: Path,
                                                         tmp_path: Path, capsys) -> None:
    folder = copy(base, "foreign" if kind == "drafter" else "target", tmp_path)
    (folder / INDEX).write_text(json.dumps(index))
    code, lines, out = generate(capsys, *((base / "target", folder) if kind == "drafter" else (folder,)))
    assert code == 2 and out == ""
    assert lines == [f"error: {folder / INDEX}: " + shown.format(folder=folder)]


def test_a_drafter_of_200000_layers_is_refused_before_one_is_built(base: Path, tmp_path: Path, capsys) -> None:
    folder = copy(base, "foreign", tmp_path)
    edit_json(folder / "config.json", lambda c: c.update(num_hidden_layers=200000))
    code, lines, out = generate(capsys, base / "target", folder)  # no answer after 60 s before
    assert code == 2 and out == ""
    assert lines == [f"error: {folder / 'config.json'}: num_hidden_layers is 200000, but its weight files hold 2 "
                     "layer(s); expected the config its weights were saved with"]


TARGET_CONFIGS = [
    (lambda c: c.update(hidden_size="abc"), "hidden_size is 'abc'; expected an integer >= 1"),
    (lambda c: c.update(vocab_size="8"), "vocab_size is '8'; expected an integer >= 1"),
    (lambda c: c.update(num_attention_heads=0), "num_attention_heads is 0; expected an integer >= 1"),
    (lambda c: c.update(eos_token_id="x"), "eos_token_id is 'x'; expected an integer in 0..7"),
    (lambda c: c.update(eos_token_id=[0, 99]), "eos_token_id is [0, 99]; expected a list of integers in 0..7"),
    (lambda c: c.update(rms_norm_eps="tiny"), "rms_norm_eps is 'tiny'; expected a finite number > 0"),
    (lambda c: c.update(layer_types=5), "layer_types is 5; expected a list of strings"),
    (lambda c: c.update(layer_types=["linear_attention"] * 3),
     "layer_types has 3 entries; expected num_hidden_layers (4) of 'linear_attention' or 'full_attention'"),
    (lambda c: c.update(rope_parameters=[1]), "rope_parameters is [1]; expected an object"),
    (lambda c: c["rope_parameters"].update(partial_rotary_factor=0.3),
     "head_dim 16 x partial_rotary_factor 0.3 rotates 4.8 dimensions; expected an even number"),
    (lambda c: c.update(tie_word_embeddings="no"), "tie_word_embeddings is 'no'; expected true or false"),
    (lambda c: (c.update(num_hidden_layers=100000), c.pop("layer_types")),  # no answer after 60 s before
     "num_hidden_layers is 100000, but its weight files hold 4 layer(s); expected the config its weights were saved with"),
]


@pytest.mark.parametrize("edit, shown", TARGET_CONFIGS)
def test_a_hand_edited_target_config_is_refused_naming_the_field(edit, shown: str, base: Path, tmp_path: Path,
                                                                 capsys) -> None:
    folder = copy(base, "target", tmp_path)
    edit_json(folder / "config.json", edit)
    code, lines, out = generate(capsys, folder)
    assert code == 2 and out == ""
    assert lines == [f"error: {folder / 'config.json'}: {shown}"]


@pytest.mark.parametrize("text, shown", [
    ("garbage{", "not readable JSON (Expecting value: line 1 column 1 (char 0)); expected a Hugging Face tokenizer file"),
    ('{"version": "1.0", "model": 5}', None),
])
def test_a_garbage_tokenizer_is_one_line(text: str, shown: str | None, base: Path, tmp_path: Path, capsys) -> None:
    folder = copy(base, "target", tmp_path)
    (folder / "tokenizer.json").write_text(text)
    code, lines, out = generate(capsys, folder)
    assert code == 2 and out == "" and len(lines) == 1
    if shown:
        assert lines == [f"error: {folder / 'tokenizer.json'}: {shown}"]
    else:
        assert lines[0].startswith(f"error: {folder}: not a readable tokenizer (") and lines[0].endswith(
            "expected a Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json, special_tokens_map.json) "
            "as transformers saves it")


@pytest.mark.parametrize("kind", ["drafter", "target"])
def test_parameters_beyond_the_hosts_memory_are_refused_before_allocation(kind: str, base: Path, capsys,
                                                                          monkeypatch) -> None:
    """A shape whose parameters cannot fit is refused naming its size fields: here a host of 30 kB (with room
    for the target first, where the drafter is the one refused)."""
    import ready.checkpoint_files

    hosts = iter([10**12] if kind == "drafter" else [])
    monkeypatch.setattr(ready.checkpoint_files, "host_memory", lambda: next(hosts, 30_000))
    code, lines, out = generate(capsys, *((base / "target", base / "foreign") if kind == "drafter" else
                                          (base / "target",)))
    assert code == 2 and out == "" and len(lines) == 1
    config = (base / ("foreign" if kind == "drafter" else "target") / "config.json")
    fields = ("num_hidden_layers 2, intermediate_size 32, num_attention_heads 2 x head_dim 16" if kind == "drafter" else
              "num_hidden_layers 4, hidden_size 32, intermediate_size 64, vocab_size 8 in float32")
    assert lines[0].startswith(f"error: {config}: {fields}: ")
    assert lines[0].endswith(" bytes of parameters, more than the 30,000 bytes of memory of this host; expected a "
                             "model that fits")


# ---------------------------------------------------------------------------------------------
# 9. sweeps.commands.generate's own options


def test_prompts_with_bytes_that_are_not_utf8_are_one_line(base: Path, tmp_path: Path, capsys) -> None:
    from sweeps.commands.generate import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"prompt_ids": [1, 2]}\n{"prompt": "def \xff\xfe add"}\n')
    code = main(["--target", str(base / "target"), "--method", "ar", "--prompts", str(prompts),
                 "--max-new-tokens", "4", "target.device=cpu"])
    out = capsys.readouterr()
    assert code == 2 and out.out == "" and errors(out.err) == [
        f"error: --prompts {prompts}, line 2: byte 0xff at column 17 is not UTF-8; expected UTF-8 JSON text"]


@pytest.mark.parametrize("option, value, shown", [
    ("--threads", "-2", "error: --threads -2; expected an integer >= 1 (CPU threads)"),
    ("--eos-id", "1e22", "error: argument --eos-id: invalid int value: '1e22' (python -m sweeps.commands.generate --help lists "
                         "the options)"),
    ("--eos-id", str(10**22), f"error: --eos-id {10**22}; expected a token id of the target (0..7)"),
    ("--eos-id", "-1", "error: --eos-id -1; expected a token id >= 0"),
    ("--tie-margin", "-1", "error: --tie-margin -1.0; expected a finite number >= 0"),
    ("--tie-margin", "nan", "error: --tie-margin nan; expected a finite number >= 0"),
])
def test_a_generate_option_out_of_range_is_one_line(option: str, value: str, shown: str, base: Path, capsys) -> None:
    from sweeps.commands.generate import main

    try:
        code = main(["--target", str(base / "target"), "--method", "ar", *PROMPT, option, value])
    except SystemExit as e:  # argparse's own refusal (a value that is no integer)
        code = e.code
    out = capsys.readouterr()
    assert code == 2 and out.out == "" and errors(out.err) == [shown] and out.err.count("\n") == 1
