"""What `mlflow ui` needs to open a sweep on its runs table: the experiment's kind and note tags,
and child runs named by row and seed."""

from __future__ import annotations

import pytest

from sweeps import tracking
from sweeps.spec import load_sweep


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_experiment_opens_as_model_training_with_the_spec_description_as_note(uri):
    c = tracking.client(uri)
    exp_id = tracking.ensure_experiment(c, "rank", "reader rank 8, 16, 32")
    tags = c.get_experiment(exp_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"  # the value mlflow's UI checks
    assert tags["mlflow.note.content"].startswith("reader rank 8, 16, 32")
    assert "python -m sweeps.run rank" in tags["mlflow.note.content"]
    assert tracking.ensure_experiment(c, "rank", "reader rank 8, 16, 32") == exp_id  # found, not re-created


def test_an_older_experiment_gets_the_tags_it_lacks_and_keeps_an_edited_note(uri):
    c = tracking.client(uri)
    old = c.create_experiment(tracking.experiment_name("layers"))  # as created before the tags existed
    assert tracking.ensure_experiment(c, "layers", "source layers") == old
    assert c.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    c.set_experiment_tag(old, "mlflow.note.content", "my own note")
    tracking.ensure_experiment(c, "layers", "source layers")
    assert c.get_experiment(old).tags["mlflow.note.content"] == "my own note"


def test_child_runs_are_named_by_row_and_seed(uri):
    c = tracking.client(uri)
    exp_id = tracking.ensure_experiment(c, "rank")
    jobs = {(j.variant.label, j.seed): j for j in load_sweep("rank", ["profile=smoke", "seeds=[0,1]"]).jobs()}
    names = {}
    for key in [("AR", 0), ("DSpark", 1), ("r=8", 0), ("r=16", 1)]:
        child = tracking.ChildRun(uri, exp_id, None, jobs[key], {})
        child.close("FINISHED")
        names[key] = c.get_run(child.run_id).info.run_name
    assert names == {("AR", 0): "AR", ("DSpark", 1): "DSpark seed 1", ("r=8", 0): "r=8 seed 0",
                     ("r=16", 1): "r=16 seed 1"}

