"""PNG plots of a bench run, drawn on the controller from summary.json: latency.png (TTFT and E2E percentiles
against concurrency with the SLO, the P95 E2E confidence bounds, the knees and each level's verdict),
throughput.png (output tokens/s and requests/s, the recommended concurrency) and, given per-GPU samples,
gpu_utilisation.png (utilisation over time with the levels' measured windows shaded).

matplotlib is imported inside the functions only: the package stays standard library only for the bench host,
which has none; render() raises PlotError there. Figures use the object API with the Agg canvas (no pyplot
registry, no window, nothing left open), matplotlib's built-in style rather than any matplotlibrc, a fixed size and
dpi, and PNGs without the Software tag: one summary renders to the same bytes on any controller with the pinned
matplotlib. INVALID levels are drawn hollow and left off the lines: their latencies say nothing about the server
(verdict.py), and the knees skip them too.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

LATENCY, THROUGHPUT, GPU = "latency.png", "throughput.png", "gpu_utilisation.png"
DPI = 100
FIGSIZE = {LATENCY: (10.0, 8.0), THROUGHPUT: (10.0, 5.0), GPU: (12.0, 5.0)}   # inches; pixels = inches x DPI
SIZES = {name: (int(w * DPI), int(h * DPI)) for name, (w, h) in FIGSIZE.items()}
VERDICT_COLOURS = {"PASS": "#2ca02c", "FAIL": "#d62728", "INCONCLUSIVE": "#ff7f0e", "INVALID": "#7f7f7f"}
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")
LINESTYLES = ("-", "--", ":", "-.")
NAN = float("nan")

GpuSeries = Dict[str, Sequence[Tuple[float, float]]]      # "node/gpu" -> [(wall-clock s, utilisation %)]
Window = Tuple[int, float, float]                         # (concurrency, wall-clock start, wall-clock end)


class PlotError(Exception):
    """The plots cannot be drawn: matplotlib is missing, or the summary has nothing to plot."""


def _matplotlib() -> Any:
    try:
        import matplotlib
        import matplotlib.style  # noqa: F401  (render's style context)
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError as error:
        raise PlotError(f"the bench plots need matplotlib, which is not importable here ({error}); they are drawn "
                        "on the controller: install requirements.txt into its venv (make venv), or plot "
                        "levels.csv yourself") from error
    return matplotlib


def available() -> bool:
    """True when matplotlib imports, so render() can draw."""
    try:
        _matplotlib()
    except PlotError:
        return False
    return True


def _figure(name: str) -> Any:
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    figure = Figure(figsize=FIGSIZE[name], dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _levels(summary: Dict[str, Any]) -> List[Dict[str, Any]]:
    levels = sorted(summary.get("levels") or [], key=lambda level: level["concurrency"])
    if not levels:
        raise PlotError("the summary has no levels to plot")
    return levels


def _targets(summary: Dict[str, Any], shown: int = 3) -> str:
    targets = list(summary.get("targets") or [])
    more = f" +{len(targets) - shown} more" if len(targets) > shown else ""
    return ", ".join(targets[:shown]) + more


def _title(summary: Dict[str, Any], what: str) -> str:
    return f"revive bench {what}: {summary.get('model', '?')} at {_targets(summary)}"


def _value(x: Optional[float]) -> float:
    return NAN if x is None else float(x)


def _invalid(level: Dict[str, Any]) -> bool:
    return level["verdict"]["verdict"] == "INVALID"


def _concurrency_axis(ax: Any, concurrencies: Sequence[int]) -> None:
    """log2 x axis, ticks at the levels' concurrencies only."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(concurrencies), [str(c) for c in concurrencies])
    ax.minorticks_off()
    ax.set_xlim(min(concurrencies) / 1.5, max(concurrencies) * 1.5)
    ax.grid(True, which="major", alpha=0.3)


def _points(ax: Any, levels: Sequence[Dict[str, Any]], values: Sequence[float], colour: str, label: str,
            linestyle: str = "-", marker: str = "o") -> None:
    """A line with filled markers through the valid levels; INVALID levels as hollow markers, off the line."""
    valid = [(level["concurrency"], v) for level, v in zip(levels, values) if not _invalid(level)]
    hollow = [(level["concurrency"], v) for level, v in zip(levels, values) if _invalid(level)]
    ax.plot([c for c, _ in valid], [v for _, v in valid], color=colour, linestyle=linestyle, marker=marker,
            label=label)
    if hollow:
        ax.plot([c for c, _ in hollow], [v for _, v in hollow], color=colour, linestyle="none", marker=marker,
                markerfacecolor="none")


def _hollow_legend(ax: Any, levels: Sequence[Dict[str, Any]]) -> None:
    if any(_invalid(level) for level in levels):
        ax.plot([], [], color="black", linestyle="none", marker="o", markerfacecolor="none",
                label="hollow: INVALID level (client-bound)")


def _distribution(ax: Any, levels: Sequence[Dict[str, Any]], metric: str, colours: Tuple[str, str, str],
                  name: str) -> List[float]:
    """p50 and p95 solid, p99 dashed where the summary has it; returns the values drawn."""
    drawn: List[float] = []
    for key, colour, style in (("p50", colours[0], "-"), ("p95", colours[1], "-"), ("p99", colours[2], "--")):
        values = [_value((level["stats"].get(metric) or {}).get(key)) for level in levels]
        if all(math.isnan(v) for v in values):
            continue
        _points(ax, levels, values, colour, f"{name} {key.upper()}", style)
        drawn += values
    return drawn


def _bounds(ax: Any, levels: Sequence[Dict[str, Any]], colour: str) -> List[float]:
    """The P95 E2E confidence bounds as error bars around the point estimate; a missing side is not drawn."""
    drawn: List[float] = []
    labelled = False
    for level in levels:
        p95 = (level["stats"].get("e2e_s") or {}).get("p95")
        bounds = level["stats"].get("e2e_p95_bounds") or {}
        lower, upper = bounds.get("lower"), bounds.get("upper")
        if p95 is None or (lower is None and upper is None):
            continue
        below = p95 - lower if lower is not None else 0.0
        above = upper - p95 if upper is not None else 0.0
        confidence = bounds.get("confidence")
        label = None if labelled else (f"P95 E2E {confidence:.0%} bounds" if confidence else "P95 E2E bounds")
        ax.errorbar([level["concurrency"]], [p95], yerr=[[below], [above]], fmt="none", ecolor=colour,
                    elinewidth=1.2, capsize=4, label=label)
        labelled = True
        drawn += [v for v in (lower, upper) if v is not None]
    return drawn


def _knee_label(knee: Dict[str, Any]) -> str:
    elasticity = knee.get("elasticity")
    return f"knee {knee['from']}->{knee['to']}" + (f"\nelasticity {elasticity:g}" if elasticity is not None else "")


def _knees(ax: Any, knees: Sequence[Dict[str, Any]]) -> None:
    for knee in knees:
        ax.axvspan(knee["from"], knee["to"], facecolor="#9467bd1f", edgecolor="#5b3a8799", linewidth=0.8)
        middle = math.sqrt(knee["from"] * knee["to"])
        ax.text(middle, 0.97, _knee_label(knee), transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=8, color="#5b3a87")


def _verdicts(ax: Any, levels: Sequence[Dict[str, Any]]) -> None:
    """Each level's verdict above its highest E2E mark (P95, P99, the upper bound); at the bottom without any."""
    for level in levels:
        verdict = level["verdict"]["verdict"]
        e2e = level["stats"].get("e2e_s") or {}
        upper = (level["stats"].get("e2e_p95_bounds") or {}).get("upper")
        known = [v for v in (e2e.get("p95"), e2e.get("p99"), upper) if v is not None]
        colour = VERDICT_COLOURS.get(verdict, "black")
        if known:
            ax.annotate(verdict, (level["concurrency"], max(known)), xytext=(0, 6), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8, fontweight="bold", color=colour)
        else:
            ax.text(level["concurrency"], 0.02, f"{verdict}\n(no answers)", transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, fontweight="bold", color=colour)


def _top(values: Sequence[float], floor: float = 0.0, headroom: float = 1.25) -> float:
    """The upper y limit: the largest finite value (or the floor) times the headroom."""
    finite = [v for v in values if not math.isnan(v)] + [floor]
    return max(max(finite), 1e-3) * headroom


def latency_figure(summary: Dict[str, Any]) -> Any:
    """TTFT (top) and E2E (bottom) percentiles against concurrency; the SLO, bounds, knees and verdicts on E2E."""
    levels = _levels(summary)
    concurrencies = [level["concurrency"] for level in levels]
    figure = _figure(LATENCY)
    ttft, e2e = figure.subplots(2, 1, sharex=True)
    knees = summary.get("knees") or []
    ttft_values = _distribution(ttft, levels, "ttft_s", ("#1f77b4", "#ff7f0e", "#2ca02c"), "TTFT")
    _knees(ttft, [k for k in knees if k["metric"].startswith("ttft_s")])
    ttft.set_ylim(0, _top(ttft_values))
    ttft.set_ylabel("time to first token (s)")
    e2e_values = _distribution(e2e, levels, "e2e_s", ("#1f77b4", "#ff7f0e", "#2ca02c"), "E2E")
    e2e_values += _bounds(e2e, levels, "#ff7f0e")
    _knees(e2e, [k for k in knees if not k["metric"].startswith("ttft_s")])
    slo = (summary.get("slo") or {}).get("e2e_p95_s")
    if slo is not None:
        e2e.axhline(slo, color="#d62728", linestyle=":", linewidth=1.5)
        e2e.text(0.01, slo, f"SLO P95 E2E <= {slo:g} s", transform=e2e.get_yaxis_transform(), ha="left",
                 va="bottom", fontsize=9, color="#d62728")
    _verdicts(e2e, levels)
    e2e.set_ylim(0, _top(e2e_values, slo or 0.0))
    e2e.set_ylabel("end-to-end latency (s)")
    e2e.set_xlabel("concurrency (log2)")
    for ax in (ttft, e2e):
        _concurrency_axis(ax, concurrencies)
        _hollow_legend(ax, levels)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    figure.suptitle(_title(summary, "latency"), fontsize=11)
    return figure


def throughput_figure(summary: Dict[str, Any]) -> Any:
    """Output tokens/s (left axis) and requests/s (right axis) against concurrency; the recommendation marked."""
    levels = _levels(summary)
    figure = _figure(THROUGHPUT)
    tokens = figure.subplots()
    requests = tokens.twinx()
    token_values = [_value(level["stats"].get("output_throughput_tok_s")) for level in levels]
    request_values = [_value(level["stats"].get("requests_per_s")) for level in levels]
    _points(tokens, levels, token_values, "#1f77b4", "output tokens/s")
    _points(requests, levels, request_values, "#ff7f0e", "requests/s", "--", "s")
    recommended = summary.get("recommended_concurrency")
    if recommended is not None:
        tokens.axvline(recommended, color="#2ca02c", linestyle=":", linewidth=2,
                       label=f"recommended concurrency {recommended}")
    else:
        tokens.text(0.5, 0.97, "no level passed: no recommended concurrency", transform=tokens.transAxes,
                    ha="center", va="top", fontsize=9, color="#d62728")
    _hollow_legend(requests, levels)
    # different headroom: with a constant answer length the two lines are proportional and would coincide
    tokens.set_ylim(0, _top(token_values))
    requests.set_ylim(0, _top(request_values, headroom=2.0))
    _concurrency_axis(tokens, [level["concurrency"] for level in levels])
    tokens.set_xlabel("concurrency (log2)")
    tokens.set_ylabel("output tokens/s")
    requests.set_ylabel("requests/s")
    handles, labels = tokens.get_legend_handles_labels()
    more_handles, more_labels = requests.get_legend_handles_labels()
    figure.legend(handles + more_handles, labels + more_labels, loc="outside lower center", ncol=4, fontsize=8)
    figure.suptitle(_title(summary, "throughput"), fontsize=11)
    return figure


def windows_from(summary: Dict[str, Any]) -> List[Window]:
    """The levels' measured windows in wall-clock seconds (summary windows are relative to clock_zero)."""
    zero = (summary.get("clock_zero") or {}).get("wall_time")
    if zero is None:
        return []
    return [(level["concurrency"], zero + level["window"][0], zero + level["window"][1])
            for level in summary.get("levels") or [] if level.get("window")]


def gpu_figure(summary: Dict[str, Any], gpu_series: GpuSeries, windows: Optional[Sequence[Window]] = None) -> Any:
    """Utilisation per "node/gpu" over time, x in seconds since the first window opened, windows shaded."""
    windows = list(windows) if windows is not None else windows_from(summary)
    samples = [t for series in gpu_series.values() for t, _ in series]
    if windows:
        zero = min(start for _, start, _ in windows)
    elif samples:
        zero = min(samples)
    else:
        raise PlotError("the GPU series have no samples and there are no windows to plot")
    figure = _figure(GPU)
    ax = figure.subplots()
    for n, (concurrency, start, end) in enumerate(windows):
        ax.axvspan(start - zero, end - zero, color=("#1f77b4", "#9467bd")[n % 2], alpha=0.1, linewidth=0)
        ax.text((start + end) / 2 - zero, 0.99, f"c={concurrency}", transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=8)
    for n, key in enumerate(sorted(gpu_series)):
        points = sorted(gpu_series[key])
        ax.plot([t - zero for t, _ in points], [u for _, u in points], label=key, linewidth=1,
                color=SERIES_COLOURS[n % len(SERIES_COLOURS)],
                linestyle=LINESTYLES[(n // len(SERIES_COLOURS)) % len(LINESTYLES)])
    ax.set_ylim(0, 108)
    ax.set_xlabel("seconds since the first level's measured window opened")
    ax.set_ylabel("GPU utilisation (%)")
    ax.grid(True, alpha=0.3)
    if gpu_series:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7,
                  ncol=1 + (len(gpu_series) - 1) // 16)
    figure.suptitle(_title(summary, "GPU utilisation"), fontsize=11)
    return figure


def _save(figure: Any, path: str) -> None:
    figure.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    figure.clear()


@contextlib.contextmanager
def _style() -> Iterator[None]:
    """matplotlib's built-in defaults, whatever matplotlibrc the controller has."""
    matplotlib = _matplotlib()
    with matplotlib.style.context("default"):
        yield


def render(summary: Dict[str, Any], out_dir: str, gpu_series: Optional[GpuSeries] = None,
           windows: Optional[Sequence[Window]] = None) -> List[str]:
    """Write latency.png, throughput.png and, when gpu_series has samples, gpu_utilisation.png into out_dir;
    returns their paths. `windows` defaults to the summary's level windows on the wall clock (windows_from)."""
    _matplotlib()
    _levels(summary)
    os.makedirs(out_dir, exist_ok=True)
    builders = [(LATENCY, lambda: latency_figure(summary)), (THROUGHPUT, lambda: throughput_figure(summary))]
    if any(gpu_series.values() if gpu_series else ()):
        builders.append((GPU, lambda: gpu_figure(summary, gpu_series, windows)))
    paths = []
    with _style():
        for name, build in builders:
            path = os.path.join(out_dir, name)
            _save(build(), path)
            paths.append(path)
    return paths
