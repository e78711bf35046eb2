"""Render a `Table` as Markdown, for the terminal and for a quick look beside the .tex file.

It says what the LaTeX says: the same caption sentences, cells, marks, bold and notes.
"""

from __future__ import annotations

from reports.tables import EFFECT_MARK, Cell, Table, caption_text, format_cell_parts, seeds_text

MISSING = "—†"


def render_cell(cell: Cell) -> str:
    if cell.kind == "text" or (cell.text and cell.mean is None):
        return (cell.text + cell.flag).replace("|", r"\|")
    if cell.mean is None:
        return MISSING
    val, std, interval = format_cell_parts(cell)
    body = val if std is None else f"{val} ± {std}"
    if interval is not None:
        body += f" [{interval[0]}, {interval[1]}]"
    if cell.kind == "speedup":
        body += "×"
    if cell.bold:
        body = f"**{body}**"
    if cell.thin:
        body += f" ({cell.thin_text})"
    return body + ("\\" + EFFECT_MARK if cell.marked else "")


def render(table: Table) -> str:
    """Title line with the caption, pipe table, and the notes on missing values and left-out runs."""
    models = ", ".join(f"`{m}`" for m in table.models) or "unknown"
    about = " ".join(caption_text(table))
    lines = [
        f"**{table.spec.name}** — {table.spec.title + ' ' if table.spec.title else ''}Sweep `{table.sweep}`, model {models}, "
        f"{seeds_text(table.seeds)}; gains relative to DSpark of the same sweep. {about}".rstrip(),
        "",
        "| " + " | ".join(c.markdown for c in table.columns) + " |",
        "|" + "|".join(":--" if c.align == "l" else "--:" for c in table.columns) + "|",
    ]
    lines += ["| " + " | ".join(render_cell(c) for c in row) + " |" for row in table.rows]
    if table.notes or table.lossless_notes:
        lines.append("")
        lines += [f"† Missing: {note}." for note in table.notes]
        lines += [f"‡ Not lossless: {note}." for note in table.lossless_notes]
    return "\n".join(lines) + "\n"
