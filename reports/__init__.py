"""MLflow runs -> polars -> the paper's LaTeX tables, Markdown previews and the survival figure.

Entry points: `python -m reports.build` and `reports.build.build_reports(...)`.
"""

from reports.errors import ReportError

__all__ = ["ReportError", "build_reports"]


def __getattr__(name: str):
    # build_reports imports mlflow and matplotlib; load them only when asked for
    if name == "build_reports":
        from reports.build import build_reports

        return build_reports
    raise AttributeError(name)
