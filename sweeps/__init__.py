"""Declarative sweeps: OmegaConf specs in experiments/ -> Optuna study -> MLflow runs.

Entry point: `python -m sweeps.run NAME [key=value ...]` (see sweeps/run.py).
"""
