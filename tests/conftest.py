import os

if not __import__("torch").cuda.is_available():
    # Triton kernels run on CPU tensors through the interpreter; set before triton is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

torch.set_num_threads(1)  # tiny models: one thread beats two (and CI has two cores)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_sweep_worker(monkeypatch):
    """Sweeps in tests run in the test's own process unless a test asks for workers (the CLI's default
    is one worker per idle core, which would make a test's mode depend on the machine's load)."""
    try:
        import sweeps.run
    except ImportError:  # an image without the sweep stack (optuna, mlflow): no sweep test runs there
        return
    monkeypatch.setattr(sweeps.run, "default_workers", lambda idle=None, threads=1: 1)


@pytest.fixture(autouse=True)
def _no_leaked_mlflow_uri(monkeypatch):
    """mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI; keep one test's store out of the next."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # recorded, so teardown restores the original
    monkeypatch.delenv("MLFLOW_TRACKING_URI")


@pytest.fixture(autouse=True)
def _fresh_teacher_memo():
    """Each test starts with empty per-process memos (ready.train.teacher_pass, ready.decode.donor)."""
    from ready.decode import donor
    from ready.train.teacher_pass import MEMO

    MEMO.clear()
    donor.clear()
    yield
    MEMO.clear()
    donor.clear()
