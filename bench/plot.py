"""The benchmark's figure as a PNG, drawn with Pillow from a saved report: TTFT vs q by stage (left) and
mean TTFT vs users for the engine and the peer (right)."""

import json
import math
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 1400, 560
STAGE_COLOURS = {"read_video_s": "#94a3b8", "vit_s": "#f59e0b", "evs_s": "#10b981", "prefill_s": "#6366f1"}
STAGE_NAMES = {"read_video_s": "read video", "vit_s": "ViT", "evs_s": "EVS", "prefill_s": "prefill"}
INK, GRID, GREY = "#111827", "#e5e7eb", "#6b7280"
ENGINE_COLOURS = ("#0f766e", "#2563eb", "#7c3aed")  # one per q
PEER_COLOUR = "#e11d48"


def font(size: int = 14) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow built without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def nice_ticks(top: float, most: int = 6) -> list[float]:
    """0 and round steps (1, 2 or 5 x 10^k) up to at least `top`, at most `most` + 1 ticks."""
    top = top if top > 0 else 1.0
    magnitude = 10 ** math.floor(math.log10(top / most))
    step = next(m * magnitude for m in (1, 2, 5, 10) if top / (m * magnitude) <= most)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


class Panel:
    """One chart in pixel box (left, top, right, bottom) with data ranges x_range and 0..y ticks."""

    def __init__(
        self, image: Image.Image, box: tuple[int, int, int, int], x_range: tuple[float, float], y_ticks: list[float]
    ):
        self.image, self.draw = image, ImageDraw.Draw(image)
        self.box, self.x_range, self.y_ticks = box, x_range, y_ticks

    def x(self, value: float) -> float:
        left, _, right, _ = self.box
        low, high = self.x_range
        return left + (value - low) / (high - low) * (right - left)

    def y(self, value: float) -> float:
        _, top, _, bottom = self.box
        return bottom - value / self.y_ticks[-1] * (bottom - top)

    def frame(self, title: str, x_ticks: list[tuple[float, str]], x_label: str, y_label: str) -> None:
        left, top, right, bottom = self.box
        draw, small = self.draw, font(13)
        for tick in self.y_ticks:
            y = self.y(tick)
            draw.line([(left, y), (right, y)], fill=GRID)
            draw.text((left - 8, y), f"{tick:g}", fill=INK, font=small, anchor="rm")
        draw.line([(left, top), (left, bottom), (right, bottom)], fill=INK)
        for value, label in x_ticks:
            draw.line([(self.x(value), bottom), (self.x(value), bottom + 5)], fill=INK)
            draw.text((self.x(value), bottom + 8), label, fill=INK, font=small, anchor="mt")
        draw.text(((left + right) / 2, top - 26), title, fill=INK, font=font(15), anchor="mb")
        draw.text(((left + right) / 2, bottom + 30), x_label, fill=INK, font=small, anchor="mt")
        label = Image.new("RGBA", (int(draw.textlength(y_label, font=small)) + 4, 18), (255, 255, 255, 0))
        ImageDraw.Draw(label).text((2, 0), y_label, fill=INK, font=small)
        rotated = label.rotate(90, expand=True)
        self.image.paste(rotated, (left - 62, int((top + bottom) / 2 - rotated.height / 2)), rotated)

    def line(self, points: list[tuple[float, float]], colour: str, dashed: bool = False) -> None:
        pixels = [(self.x(a), self.y(b)) for a, b in points]
        for (x0, y0), (x1, y1) in zip(pixels, pixels[1:]):
            if not dashed:
                self.draw.line([(x0, y0), (x1, y1)], fill=colour, width=3)
                continue
            length = math.hypot(x1 - x0, y1 - y0)
            for start in range(0, int(length), 12):
                a, b = start / length, min(start + 7, length) / length
                self.draw.line(
                    [(x0 + a * (x1 - x0), y0 + a * (y1 - y0)), (x0 + b * (x1 - x0), y0 + b * (y1 - y0))],
                    fill=colour,
                    width=3,
                )
        for x, y in pixels:
            self.draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)

    def bar(self, x: float, low: float, high: float, half_width: float, colour: str) -> None:
        self.draw.rectangle([self.x(x) - half_width, self.y(high), self.x(x) + half_width, self.y(low)], fill=colour)

    def legend(self, entries: list[tuple[str, str, str]]) -> None:
        """entries: (label, colour, "line" | "dashed" | "box"), stacked at the top left of the chart."""
        left, top, _, _ = self.box
        for row, (label, colour, kind) in enumerate(entries):
            x, y = left + 14, top + 12 + 20 * row
            if kind == "box":
                self.draw.rectangle([x, y - 6, x + 22, y + 6], fill=colour)
            else:
                for start in (0, 8, 16) if kind == "dashed" else (0,):
                    self.draw.line(
                        [(x + start, y), (x + (start + 6 if kind == "dashed" else 22), y)], fill=colour, width=3
                    )
            self.draw.text((x + 30, y), label, fill=INK, font=font(13), anchor="lm")


def ttft_panel(image: Image.Image, box, rows: list[dict], model: str) -> None:
    rates = [row["pruning_rate"] for row in rows]
    top = max(max(row["ttft_s"], row["ideal_ttft_s"]) for row in rows) * 1.45  # room for the legend
    panel = Panel(image, box, (min(rates) - 0.08, max(rates) + 0.08), nice_ticks(top))
    panel.frame(f"TTFT vs q, one request alone ({model})", [(q, f"{q:g}") for q in rates], "pruning rate q", "seconds")
    gaps = [panel.x(b) - panel.x(a) for a, b in zip(rates, rates[1:])]
    half = 0.3 * min(gaps) if gaps else 20
    for row in rows:
        low = 0.0
        for stage, colour in STAGE_COLOURS.items():
            panel.bar(row["pruning_rate"], low, low + row[stage], half, colour)
            low += row[stage]
    panel.line([(row["pruning_rate"], row["ideal_ttft_s"]) for row in rows], GREY, dashed=True)
    panel.line([(row["pruning_rate"], row["ttft_s"]) for row in rows], INK)
    panel.legend(
        [("TTFT measured", INK, "line"), ("ideal: prefill scales with kept tokens", GREY, "dashed")]
        + [(STAGE_NAMES[stage], colour, "box") for stage, colour in STAGE_COLOURS.items()]
    )


def users_panel(image: Image.Image, box, rows: list[dict]) -> None:
    users = sorted({row["users"] for row in rows})
    rates = sorted({row["pruning_rate"] for row in rows})
    top = max(max(row["mean_ttft_s"], row["peer_mean_ttft_s"], row["pipelined_ideal_s"]) for row in rows) * 1.3
    panel = Panel(image, box, (0, max(users) + 1), nice_ticks(top))
    panel.frame("mean TTFT vs users at once", [(n, str(n)) for n in users], "users submitting at once", "seconds")

    def series(q: float, key: str) -> list[tuple[float, float]]:
        return [(row["users"], row[key]) for row in rows if row["pruning_rate"] == q]

    entries = []
    panel.line(series(rates[0], "peer_mean_ttft_s"), PEER_COLOUR)
    entries.append(("peer: stock transformers, one at a time (any q)", PEER_COLOUR, "line"))
    panel.line(series(rates[0], "pipelined_ideal_s"), GREY, dashed=True)
    entries.append((f"pipelined ideal, q = {rates[0]:g}", GREY, "dashed"))
    for q, colour in zip(rates, ENGINE_COLOURS):
        panel.line(series(q, "mean_ttft_s"), colour)
        entries.append((f"engine, q = {q:g}", colour, "line"))
    panel.legend(entries)


def write_plot(report: dict, path: Path) -> Path:
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    ttft_panel(image, (90, 60, 660, 480), report["ttft_by_rate"], report["environment"]["model"]["name"])
    users_panel(image, (790, 60, 1360, 480), report["users"])
    draw.text(
        (WIDTH / 2, HEIGHT - 14), f"{report['command']}, {report['started_at']}", fill=GREY, font=font(12), anchor="mb"
    )
    image.save(path)
    return path


def plot_file(json_path: Path) -> Path:
    """Draw the PNG of a saved report beside it (same name, .png); returns its path."""
    return write_plot(json.loads(Path(json_path).read_text()), Path(json_path).with_suffix(".png"))
