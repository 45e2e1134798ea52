"""The accuracy benchmark's charts (bench/accuracy.py) as standalone SVG, drawn by hand: no plotting library
on a bare machine."""

from assets.shapes import PAIR, QUESTIONS

KINDS = (*QUESTIONS, PAIR)  # every question type, the two-clip one last
PLOT_COLOURS = {"colour": "#0f766e", "direction": "#e11d48", "shape": "#6366f1", "start": "#d97706", PAIR: "#0284c7"}
DASHES = ("", "6 4", "2 3")  # one per model: the first solid


def svg_plot(tables: dict[str, dict[str, dict[str, float]]], title: str) -> str:
    """Accuracy (0-1, y) against q (0-1, x) as a standalone SVG: one colour per question type, one dash
    pattern per model (tables: {model: {rate: {question type: accuracy}}}, at most len(DASHES) models)."""
    width, height, left, right, top, bottom = 560, 320, 50, 190, 30, 40
    plot_w, plot_h = width - left - right, height - top - bottom

    def point(q: float, accuracy: float) -> str:
        return f"{left + q * plot_w:.1f},{top + (1 - accuracy) * plot_h:.1f}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">{title}</text>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x, y = left + tick * plot_w, top + (1 - tick) * plot_h
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        parts.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>')
        parts.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{tick:g}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">pruning rate q</text>')
    legend_x = width - right + 12
    shown = list(dict.fromkeys(kind for table in tables.values() for kind in kinds_of(table)))
    for model, dash in zip(tables, DASHES):
        for kind in kinds_of(tables[model]):
            table, colour = tables[model], PLOT_COLOURS[kind]
            points = " ".join(point(float(rate), scores[kind]) for rate, scores in table.items())
            parts.append(
                f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2" '
                f'stroke-dasharray="{dash}"/>'
            )
            for rate, scores in table.items():
                x, y = point(float(rate), scores[kind]).split(",")
                parts.append(f'<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>')
    for row, kind in enumerate(shown):
        legend_y = top + 10 + 18 * row
        parts.append(
            f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 20}" y2="{legend_y}" '
            f'stroke="{PLOT_COLOURS[kind]}" stroke-width="2"/>'
        )
        parts.append(f'<text x="{legend_x + 26}" y="{legend_y + 4}">{kind}</text>')
    for row, (model, dash) in enumerate(zip(tables, DASHES)):
        legend_y = top + 10 + 18 * (len(shown) + 1 + row)
        parts.append(
            f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 20}" y2="{legend_y}" '
            f'stroke="#111827" stroke-width="2" stroke-dasharray="{dash}"/>'
        )
        parts.append(f'<text x="{legend_x + 26}" y="{legend_y + 4}">{model}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def kinds_of(table: dict[str, dict[str, float]]) -> list[str]:
    """The question types a table ({rate: {question type: share}}) holds, in KINDS order."""
    return [kind for kind in KINDS if kind in next(iter(table.values()))]


METHOD_COLOURS = {"evs": "#0f766e", "vidcom2": "#6366f1", "uniform": "#d97706"}
METHOD_DASHES = {"evs": "", "vidcom2": "6 3", "uniform": "2 3"}  # lines that coincide stay apart


def svg_methods_plot(results: dict[str, dict[str, dict[str, dict]]], title: str) -> str:
    """Accuracy (0-1, y) against q (x, the measured rates) as a standalone SVG: a panel per model (rows) and
    question type (columns), a line per pruning method in its colour. results: {model: {method: {rate:
    {"accuracy": {question type: share}, ...}}}}, every method measured at the same rates."""
    models = list(results)
    methods = list(next(iter(results.values())))
    first = next(iter(next(iter(results.values())).values()))
    rates = [float(rate) for rate in first]
    kinds = kinds_of({rate: scores["accuracy"] for rate, scores in first.items()})
    low, high = min(rates), max(rates)
    panel_w, panel_h, gap, left, top, right = 150, 110, 28, 150, 40, 120
    width = left + len(kinds) * (panel_w + gap) + right
    height = top + len(models) * (panel_h + gap + 14) + 20

    def point(x0: float, y0: float, q: float, share: float) -> tuple[float, float]:
        along = (q - low) / (high - low) if high > low else 0.5
        return x0 + along * panel_w, y0 + (1 - share) * panel_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>',
        f'<text x="10" y="18" font-size="13">{title}</text>',
    ]
    for row, model in enumerate(models):
        y0 = top + row * (panel_h + gap + 14)
        parts.append(f'<text x="10" y="{y0 + panel_h / 2:.1f}" font-size="12">{model}</text>')
        for column, kind in enumerate(kinds):
            x0 = left + column * (panel_w + gap)
            if row == 0:
                parts.append(f'<text x="{x0 + panel_w / 2:.1f}" y="{top - 8}" text-anchor="middle">{kind}</text>')
            for share in (0.0, 0.5, 1.0):
                _, y = point(x0, y0, low, share)
                parts.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + panel_w}" y2="{y:.1f}" stroke="#e5e7eb"/>')
                if column == 0:
                    parts.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{share:g}</text>')
            for q in rates:
                x, y = point(x0, y0, q, 0.0)
                parts.append(f'<text x="{x:.1f}" y="{y + 14:.1f}" text-anchor="middle">{q:g}</text>')
            for method in methods:
                table = results[model][method]
                xy = [point(x0, y0, float(rate), scores["accuracy"][kind]) for rate, scores in table.items()]
                parts.append(
                    f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}" fill="none" '
                    f'stroke="{METHOD_COLOURS.get(method, "#111827")}" stroke-width="2" '
                    f'stroke-dasharray="{METHOD_DASHES.get(method, "")}"/>'
                )
                parts += [
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{METHOD_COLOURS.get(method, "#111827")}"/>'
                    for x, y in xy
                ]
    legend_x = width - right + 10
    for row, method in enumerate(methods):
        legend_y = top + 10 + 18 * row
        parts.append(
            f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 20}" y2="{legend_y}" '
            f'stroke="{METHOD_COLOURS.get(method, "#111827")}" stroke-width="2" '
            f'stroke-dasharray="{METHOD_DASHES.get(method, "")}"/>'
        )
        parts.append(f'<text x="{legend_x + 26}" y="{legend_y + 4}">{method}</text>')
    parts.append(f'<text x="{legend_x}" y="{top + 10 + 18 * len(methods) + 8}">x: pruning rate q</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
