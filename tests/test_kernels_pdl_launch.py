"""The launch arguments of the PDL-aware kernels: none off Hopper (or on CPU); on Hopper the PDL
launch, and the GEMVs' early trigger unless READY_PDL_EARLY=0 switches it off."""

import os
import subprocess
import sys

import torch

from ready_kernels import _common


def test_no_pdl_arguments_on_cpu():
    assert _common.pdl_launch(torch.device("cpu")) == {}
    assert _common.pdl_launch(torch.device("cpu"), early=True) == {}


def test_on_a_pdl_device_the_gemvs_get_the_early_trigger_unless_switched_off(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setitem(_common._PDL, 0, True)  # as pdl_enabled decides it on a Hopper GPU
    monkeypatch.setattr(_common, "_PDL_EARLY", False)
    assert _common.pdl_launch(gpu) == {"launch_pdl": True, "PDL": True}
    assert _common.pdl_launch(gpu, early=True) == {"launch_pdl": True, "PDL": True, "EARLY": False}
    monkeypatch.setattr(_common, "_PDL_EARLY", True)
    assert _common.pdl_launch(gpu, early=True)["EARLY"] is True
    assert "EARLY" not in _common.pdl_launch(gpu)  # kernels without the constexpr never get it
    monkeypatch.setitem(_common._PDL, 0, False)  # READY_PDL=0, or an older GPU
    assert _common.pdl_launch(gpu, early=True) == {}


def test_the_early_trigger_is_on_by_default_and_a_misspelt_switch_is_refused():
    probe = "from ready_kernels import _common; print(_common._PDL_EARLY)"
    env = {k: v for k, v in os.environ.items() if k != "READY_PDL_EARLY"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    bad = subprocess.run([sys.executable, "-c", probe], env={**env, "READY_PDL_EARLY": "yes"}, capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "READY_PDL_EARLY must be 1 (default) or 0, got 'yes'" in bad.stderr
