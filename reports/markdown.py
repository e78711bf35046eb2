"""Render a `Table` as Markdown, for the terminal and for a quick look beside the .tex file."""

from __future__ import annotations

from reports.tables import Cell, Table, format_cell_parts, seeds_text

MISSING = "—†"


def render_cell(cell: Cell) -> str:
    if cell.kind == "text" or (cell.text and cell.mean is None):
        return cell.text.replace("|", r"\|")
    if cell.mean is None:
        return MISSING
    val, std = format_cell_parts(cell)
    body = val if std is None else f"{val} ± {std}"
    if cell.kind == "speedup":
        body += "×"
    return f"**{body}**" if cell.bold else body


def render(table: Table) -> str:
    """Title line, pipe table, and the notes on missing values."""
    models = ", ".join(f"`{m}`" for m in table.models) or "unknown"
    spread = " (mean ± std over seeds)" if table.seeds[1] > 1 else ""
    lines = [
        f"**{table.spec.name}** — {table.spec.title + ' ' if table.spec.title else ''}Sweep `{table.sweep}`, model {models}, "
        f"{seeds_text(table.seeds)}{spread}; gains relative to DSpark of the same sweep.",
        "",
        "| " + " | ".join(c.markdown for c in table.columns) + " |",
        "|" + "|".join(":--" if c.align == "l" else "--:" for c in table.columns) + "|",
    ]
    lines += ["| " + " | ".join(render_cell(c) for c in row) + " |" for row in table.rows]
    if table.notes:
        lines.append("")
        lines += [f"† Missing: {note}." for note in table.notes]
    return "\n".join(lines) + "\n"
