"""Plotly figures of one request's pruning picture.

They are built once per request, when the engine's "evs" event arrives, and sent before the first
token. Arrays go into the figures as small numpy dtypes so plotly encodes them as base64 typed arrays
("bdata") instead of long JSON lists.
"""

import json

import numpy as np
import plotly.graph_objects as go

from engine.stream import EvsPicture

KEPT_COLOR = "#0d9488"  # teal; the frame overlays leave kept patches untouched
PRUNED_COLOR = "#e11d48"  # rose; the frame overlays tint pruned patches with it
_FONT = dict(family="Inter, system-ui, sans-serif", size=12, color="#334155")
_GRID_COLOR = "#e2e8f0"
_NAN_COLOR = "#cbd5e1"  # heatmap cells without a value (group 0) show the plot background


def kept_per_group(picture: EvsPicture) -> np.ndarray:
    """(T,) int32: tokens each temporal group sends to the language model."""
    num_groups = picture.kept_mask.shape[0]
    return picture.kept_mask.reshape(num_groups, -1).sum(axis=1).astype(np.int32)


def group_tick_labels(picture: EvsPicture) -> list[str]:
    """One axis label per temporal group: its centre time in seconds."""
    return [f"{t:.1f} s" for t in picture.timestamps_s]


def tokens_per_group_figure(picture: EvsPicture) -> go.Figure:
    """Stacked bars: kept vs pruned tokens of each temporal group, x labelled with its timestamp.

    x is the group index (ticks show the time) so that two groups whose times round to the same
    label still get their own bar.
    """
    num_groups, h, w = picture.grid_thw
    tokens_per_group = h * w
    kept = kept_per_group(picture)
    pruned = (tokens_per_group - kept).astype(np.int32)
    group_index = np.arange(num_groups, dtype=np.int32)
    time_s = np.asarray(picture.timestamps_s, dtype=np.float32)
    kept_total = int(kept.sum())
    total = num_groups * tokens_per_group
    pruned_pct = 100.0 * (total - kept_total) / total if total else 0.0

    hover = "t=%{customdata:.2f} s<br>%{y} of " + str(tokens_per_group) + " tokens %{meta}<extra></extra>"
    fig = go.Figure(
        [
            go.Bar(
                x=group_index,
                y=kept,
                name="kept",
                marker_color=KEPT_COLOR,
                customdata=time_s,
                meta="kept",
                hovertemplate=hover,
            ),
            go.Bar(
                x=group_index,
                y=pruned,
                name="pruned",
                marker_color=PRUNED_COLOR,
                customdata=time_s,
                meta="pruned",
                hovertemplate=hover,
            ),
        ]
    )
    fig.update_layout(
        barmode="stack",
        bargap=0.15,
        title=dict(
            text=f"Tokens per temporal group: {kept_total:,} of {total:,} kept ({pruned_pct:.0f}% pruned)",
            x=0.0,
            xanchor="left",
            font=dict(size=14),
        ),
        yaxis_title=f"tokens (of {tokens_per_group} per group)",
        yaxis=dict(range=[0, tokens_per_group], gridcolor=_GRID_COLOR, automargin=True),
        plot_bgcolor="rgba(0,0,0,0)",
        xaxis=dict(
            title="group time (centre)",
            tickmode="array",
            tickvals=group_index,
            ticktext=group_tick_labels(picture),
            automargin=True,
        ),
        legend_traceorder="normal",
        **_base_layout(),
    )
    return fig


def dissimilarity_figure(picture: EvsPicture) -> go.Figure:
    """Heatmap of 1 - cos(previous group) per token: rows are groups, columns are patches in raster order.

    Group 0 has no predecessor (+inf, always kept); its row shows the grey background. Dots mark the kept
    tokens.
    """
    num_groups, h, w = picture.grid_thw
    tokens_per_group = h * w
    dissim = picture.dissimilarity.reshape(num_groups, tokens_per_group).astype(np.float32)
    dissim[~np.isfinite(dissim)] = np.nan  # JSON and colour scales have no +inf
    finite_max = float(np.nanmax(dissim)) if np.isfinite(dissim).any() else 1.0
    kept_group, kept_patch = np.nonzero(picture.kept_mask.reshape(num_groups, tokens_per_group))
    group_index = np.arange(num_groups, dtype=np.int32)
    ticks = group_tick_labels(picture)
    ticks[0] += " (first)"

    fig = go.Figure(
        [
            go.Heatmap(
                z=dissim,
                x=np.arange(tokens_per_group, dtype=np.int32),
                y=group_index,
                colorscale="Viridis",
                zmin=0.0,
                zmax=max(finite_max, 1e-6),
                colorbar=dict(title=dict(text="1 − cos", side="right"), thickness=12),
                hovertemplate="group %{y} · patch %{x}<br>1 − cos = %{z:.3f}<extra></extra>",
            ),
            go.Scatter(
                x=kept_patch.astype(np.int32),
                y=kept_group.astype(np.int32),
                mode="markers",
                name="kept",
                marker=dict(symbol="circle", size=6, color="white", line=dict(width=1, color="#0f172a")),
                hovertemplate="group %{y} · patch %{x}: kept<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        title=dict(
            text=f"Change since the previous group ({h}×{w} patches per group, ○ = kept)",
            x=0.0,
            xanchor="left",
            font=dict(size=14),
        ),
        xaxis=dict(title="patch (row-major)", showgrid=False, zeroline=False, automargin=True),
        yaxis=dict(
            title="group",
            autorange="reversed",
            tickmode="array",
            tickvals=group_index,
            ticktext=ticks,
            showgrid=False,
            zeroline=False,
            automargin=True,
        ),
        plot_bgcolor=_NAN_COLOR,
        showlegend=False,
        **_base_layout(),
    )
    return fig


def figures_payload(picture: EvsPicture) -> dict:
    """Both figures as plotly JSON dicts, for the `/ask` API: {"tokens_per_group": ..., "dissimilarity": ...}.

    A client rebuilds one with `plotly.io.from_json(json.dumps(payload["dissimilarity"]))`.
    """
    return {
        "tokens_per_group": json.loads(tokens_per_group_figure(picture).to_json()),
        "dissimilarity": json.loads(dissimilarity_figure(picture).to_json()),
    }


def _base_layout() -> dict:
    # "none" keeps plotly's large default template out of the payload; style is set here instead.
    return dict(
        template="none",
        font=_FONT,
        height=320,
        margin=dict(l=60, r=20, t=48, b=48),
        paper_bgcolor="rgba(0,0,0,0)",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
    )


TTFT_COLOR = "#334155"  # slate: time, on the second axis
# One colour per pruning method when a sweep runs several (EVS keeps the kept-token teal).
METHOD_COLORS = {"evs": KEPT_COLOR, "vidcom2": "#6366f1", "uniform": "#d97706"}


def sweep_figure(rows: list[dict]) -> go.Figure:
    """Kept video tokens (bars, left axis), TTFT and prefill time (lines, right axis) against the rate q.

    In a sweep the requests queue for prefill behind each other (shortest first), so TTFT also holds the
    wait for the others; the prefill line is each rate's own cost.

    rows: one stats dict per request (the engine's keys), in any order; plotted by increasing q. The x axis
    is categorical so that each rate gets its own bar however close the rates are. Rows of several pruning
    methods get a bar and a TTFT line per method, in the method's colour (and no prefill lines).
    """
    rows = sorted(rows, key=lambda stats: stats["pruning_rate"])
    methods = list(dict.fromkeys(stats["pruning_method"] for stats in rows))
    total = max((stats["video_tokens_total"] for stats in rows), default=0)
    if len(methods) == 1:
        traces = _rate_traces(rows, "video tokens kept", "TTFT", KEPT_COLOR, TTFT_COLOR)
        traces.append(_line(rows, "prefill_s", "prefill", PRUNED_COLOR, "dot", 6))
    else:
        traces = []
        for method in methods:
            of_method = [stats for stats in rows if stats["pruning_method"] == method]
            colour = METHOD_COLORS.get(method, TTFT_COLOR)
            traces += _rate_traces(of_method, f"kept · {method}", f"TTFT · {method}", colour, colour)
        traces = traces[0::2] + traces[1::2]  # bars first, then lines, for the legend
    fig = go.Figure(traces)
    layout = _base_layout()
    # Under the plot: beside the title it would cover it on a phone.
    layout["legend"] = dict(orientation="h", yanchor="top", y=-0.28, xanchor="left", x=0.0)
    layout["margin"] = dict(layout["margin"], b=96)
    fig.update_layout(
        title=dict(
            text=f"Kept tokens (of {total:,}), TTFT and prefill against q"
            if len(methods) == 1
            else f"Kept tokens (of {total:,}) and TTFT against q, per method",
            x=0.0,
            xanchor="left",
            font=dict(size=14),
        ),
        xaxis=dict(title="pruning rate q", type="category", automargin=True),
        yaxis=dict(title="video tokens kept", rangemode="tozero", gridcolor=_GRID_COLOR, automargin=True),
        yaxis2=dict(title="seconds", overlaying="y", side="right", rangemode="tozero", showgrid=False, automargin=True),
        plot_bgcolor="rgba(0,0,0,0)",
        barmode="group",
        **layout,
    )
    return fig


def _rate_traces(rows: list[dict], kept_name: str, ttft_name: str, bar_colour: str, line_colour: str) -> list:
    """[kept tokens as bars, TTFT as a line] of rows against q (category labels)."""
    labels = [f"{stats['pruning_rate']:g}" for stats in rows]
    kept = np.array([stats["video_tokens_kept"] for stats in rows], dtype=np.int32)
    return [
        go.Bar(
            x=labels,
            y=kept,
            name=kept_name,
            marker_color=bar_colour,
            hovertemplate=f"{kept_name}, q=%{{x}}: %{{y}} tokens<extra></extra>",
        ),
        _line(rows, "ttft_s", ttft_name, line_colour, "solid", 8),
    ]


def _line(rows: list[dict], key: str, name: str, colour: str, dash: str, marker_px: int) -> go.Scatter:
    """Seconds of `key` against q on the right axis."""
    labels = [f"{stats['pruning_rate']:g}" for stats in rows]
    seconds = np.array([stats[key] for stats in rows], dtype=np.float32)
    return go.Scatter(
        x=labels,
        y=seconds,
        name=name,
        yaxis="y2",
        mode="lines+markers",
        line=dict(color=colour, width=2, dash=dash),
        marker=dict(size=marker_px),
        hovertemplate=f"{name}, q=%{{x}}: %{{y:.3f}} s<extra></extra>",
    )


def live_tokens_figure(times_s: list[float], kept_per_s: list[float], total_per_s: list[float]) -> go.Figure:
    """A live session's video tokens per second over time: those causal EVS kept (the language model's load) and,
    dashed, all of them before pruning. times_s: seconds since the session opened, one per point."""
    times = np.asarray(times_s, dtype=np.float32)
    fig = go.Figure(
        [
            go.Scatter(
                x=times,
                y=np.asarray(total_per_s, dtype=np.float32),
                name="before pruning",
                mode="lines",
                line=dict(color=_NAN_COLOR, width=2, dash="dash"),
                hovertemplate="%{x:.0f} s: %{y:.1f} tokens/s before pruning<extra></extra>",
            ),
            go.Scatter(
                x=times,
                y=np.asarray(kept_per_s, dtype=np.float32),
                name="kept",
                mode="lines",
                line=dict(color=KEPT_COLOR, width=2),
                fill="tozeroy",
                hovertemplate="%{x:.0f} s: %{y:.1f} tokens/s kept<extra></extra>",
            ),
        ]
    )
    layout = _base_layout()
    layout.update(height=240, margin=dict(l=48, r=12, t=40, b=40))
    fig.update_layout(
        title=dict(text="Video tokens per second", x=0.0, xanchor="left", font=dict(size=14)),
        xaxis=dict(title="seconds", gridcolor=_GRID_COLOR, automargin=True),
        yaxis=dict(title="tokens / s", rangemode="tozero", gridcolor=_GRID_COLOR, automargin=True),
        plot_bgcolor="rgba(0,0,0,0)",
        **layout,
    )
    return fig
