"""Render a `Table` as booktabs LaTeX: a full `table` float, or a tabular-only fragment for \\input{}.

No vertical rules; \\toprule/\\midrule/\\bottomrule and \\cmidrule under group headers; a value in
bold where its row's paired interval against every other row excludes 0; a comparison that stays
significant after Holm's correction over the table marked with a superscript *; a comparison on too
few differing units shows "(k of N differ)" instead of an interval; a missing value is a
dagger-marked dash and a not-lossless row a double dagger, explained in notes set under the bottom
rule (inside the tabular, so fragments carry them too).
"""

from __future__ import annotations

from reports.tables import EFFECT_MARK, Cell, Table, caption_text, format_cell_parts, seeds_text

_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "–": "--",
    "×": r"$\times$",
    "τ": r"$\tau$",
    "Δ": r"$\Delta$",
    "±": r"$\pm$",
    "−": "--",
    "†": r"$^{\dagger}$",
    "‡": r"$^{\ddagger}$",
    "Σ": r"$\Sigma$",
    "α": r"$\alpha$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "≈": r"$\approx$",
    "·": r"$\cdot$",
    "√": r"$\surd$",
    "²": r"$^{2}$",
    "—": "---",
    "…": r"\ldots{}",
}

MISSING = r"--$^{\dagger}$"
WIDE_COLUMNS = 6  # wider tables become a `table*` scaled to \textwidth (needs graphicx)


def escape(text: str) -> str:
    """Make arbitrary text (labels, sweep and model names, notes) safe in LaTeX text mode."""
    return "".join(_ESCAPES.get(ch, ch) for ch in text)


def render_cell(cell: Cell) -> str:
    if cell.kind == "text" or (cell.text and cell.mean is None):
        return escape(cell.text + cell.flag)
    if cell.mean is None:
        return MISSING
    val, std, interval = format_cell_parts(cell)
    body = val if std is None else rf"{val} \pm {std}"
    if interval is not None:
        body += rf"\;[{interval[0]}, {interval[1]}]"
    if cell.kind == "speedup":
        body += r"\times"
    if cell.bold:
        body = rf"\mathbf{{{body}}}"
    if cell.marked:
        body += rf"^{{{EFFECT_MARK}}}"
    return f"${body}$" + (f" ({escape(cell.thin_text)})" if cell.thin else "")


def caption(table: Table) -> str:
    """Caption: the title, the sweep, model(s) and seeds, then how much data stands behind a cell
    and how to read its interval, mark and bold (the same sentences as the Markdown preview)."""
    model = ", ".join(rf"\texttt{{{escape(m)}}}" for m in table.models) or "unknown"
    n_models = "models" if len(table.models) > 1 else "model"
    seeds = escape(seeds_text(table.seeds))
    title = escape(table.spec.title) + " " if table.spec.title else ""
    about = " ".join(escape(s) for s in caption_text(table))
    return (
        f"{title}Sweep \\texttt{{{escape(table.sweep)}}}, {n_models} {model}, "
        f"{seeds}; gains relative to DSpark of the same sweep. {about}"
    ).rstrip()


def tabular(table: Table) -> str:
    """The tabular environment alone (booktabs rules, group headers, rows, notes)."""
    cols = table.columns
    n = len(cols)
    lines = [rf"\begin{{tabular}}{{{''.join(c.align for c in cols)}}}", r"\toprule"]
    if any(c.group for c in cols):
        head, rules, i = [], [], 0
        while i < n:
            j = i
            while j + 1 < n and cols[j + 1].group == cols[i].group:
                j += 1
            if cols[i].group:
                head.append(rf"\multicolumn{{{j - i + 1}}}{{c}}{{{escape(cols[i].group)}}}")
                rules.append(rf"\cmidrule(lr){{{i + 1}-{j + 1}}}")
            else:
                head += [""] * (j - i + 1)
            i = j + 1
        lines += [" & ".join(head) + r" \\", " ".join(rules)]
    lines.append(" & ".join(c.latex for c in cols) + r" \\")
    lines.append(r"\midrule")
    for k, row in enumerate(table.rows):
        if k in table.rule_before:
            lines.append(r"\midrule")
        lines.append(" & ".join(render_cell(c) for c in row) + r" \\")
    lines.append(r"\bottomrule")
    for marker, title, notes in ((r"$^{\dagger}$", "Missing", table.notes),
                                 (r"$^{\ddagger}$", "Not lossless", table.lossless_notes)):
        for k, note in enumerate(notes):
            mark = rf"{marker}\,{title}: " if k == 0 else rf"\phantom{{{marker}\,{title}: }}"
            lines.append(rf"\multicolumn{{{n}}}{{l}}{{\footnotesize {mark}{escape(note)}.}} \\")
    lines.append(r"\end{tabular}")
    return "\n".join(lines) + "\n"


def render(table: Table, fragment: bool = False) -> str:
    """The .tex file: a `table` float with caption and label, or (fragment) the tabular only.

    A table wider than WIDE_COLUMNS columns (Table 1) is a `table*` whose tabular is scaled to
    \\textwidth; a fragment is never scaled, the including document decides.
    """
    wide = not fragment and len(table.columns) > WIDE_COLUMNS
    needs = r"\usepackage{booktabs}" + (r" and \usepackage{graphicx}" if wide else "")
    head = [
        f"% {table.spec.name}: generated by `python -m reports.build` from MLflow sweep "
        f"'{table.sweep}'; do not edit by hand. Needs {needs}.",
    ]
    if fragment:
        head += [f"% caption: {caption(table)}", f"% label: {table.label}"]
        return "\n".join(head) + "\n" + tabular(table)
    inner = tabular(table).rstrip("\n")
    env = "table"
    if wide:  # Table 1: span both columns and fit the text width
        env = "table*"
        inner = "\\resizebox{\\textwidth}{!}{%\n" + inner + "%\n}"
    body = [
        rf"\begin{{{env}}}[t]",
        r"\centering",
        rf"\caption{{{caption(table)}}}",
        rf"\label{{{table.label}}}",
        r"\small",
        inner,
        rf"\end{{{env}}}",
    ]
    return "\n".join(head + body) + "\n"
