"""The launch arguments of the PDL-aware kernels: none off Hopper (or on CPU); on Hopper the PDL
launch, and the GEMVs' early trigger."""

import torch

from ready_kernels import _common


def test_no_pdl_arguments_on_cpu():
    assert _common.pdl_launch(torch.device("cpu")) == {}
    assert _common.pdl_launch(torch.device("cpu"), early=True) == {}


def test_on_a_pdl_device_the_gemvs_get_the_early_trigger(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setitem(_common._PDL, 0, True)  # as pdl_enabled decides it on a Hopper GPU
    assert _common.pdl_launch(gpu) == {"launch_pdl": True, "PDL": True}
    assert _common.pdl_launch(gpu, early=True) == {"launch_pdl": True, "PDL": True, "EARLY": True}
    monkeypatch.setitem(_common._PDL, 0, False)  # an older GPU, or the Triton interpreter
    assert _common.pdl_launch(gpu, early=True) == {}
