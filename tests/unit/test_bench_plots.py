"""revive bench's PNG plots (module_utils/revive_bench/plots.py): valid PNGs of the stated size, knees, SLO,
verdicts and INVALID levels drawn as stated, the GPU plot only with samples, a clear PlotError without matplotlib,
no figure left open, the same bytes on every render."""
from __future__ import annotations

import builtins
import os
import struct
import subprocess
import sys
import zlib

import matplotlib
import matplotlib.pyplot
import pytest

from ansible.module_utils.revive_bench import metrics, plots
from ansible.module_utils.revive_bench.verdict import Bounds, judge, knees, recommend

SLO = Bounds(slo_e2e_p95_s=12.0)
WALL_ZERO = 1_800_000_000.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def level(concurrency, ttft, e2e, n=100, lag_p99=0.002, failed=0):
    """A level as summary.json has it: n answers spread over [1, 2) x the given TTFT and E2E, judged."""
    records = [{"sent": 0.0, "events": [[ttft * (1 + k / n), 1], [e2e * (1 + k / n), 199]], "ok": True,
                "max_tokens": 200, "ignore_eos": False, "usage": {"completion_tokens": 200}, "error": None}
               for k in range(n)]
    records += [{"sent": 0.0, "events": [], "ok": False, "error": "HTTP 503: busy", "max_tokens": 200}] * failed
    stats = metrics.aggregate(records, 30.0, 200 * n)
    stats["dispatch_lag_s"] = {"p50": lag_p99 / 2, "p99": lag_p99, "max": lag_p99}
    stats["achieved_concurrency"] = float(concurrency)
    index = concurrency.bit_length()
    return {"concurrency": concurrency, "rate": None, "window": [10.0 + 40 * index, 40.0 + 40 * index],
            "stats": stats, "verdict": judge(stats, concurrency, SLO).as_dict(), "node": None}


def summary_of(levels, targets=("http://10.0.0.1:8000", "http://10.0.0.2:8000")):
    return {"model": "qwen2.5-7b-instruct", "targets": list(targets), "slo": {"e2e_p95_s": 12.0, "confidence": 0.95},
            "levels": levels, "recommended_concurrency": recommend(levels),
            "knees": knees(levels, "ttft_s", "p50", 0.5) + knees(levels, "e2e_s", "p95", 0.5),
            "clock_zero": {"wall_time": WALL_ZERO}}


@pytest.fixture(scope="module")
def summary():
    """PASS at 4, 8 and 16, the field report's TTFT knee 16 -> 32 (FAIL there), INVALID at 64 (lagging client),
    INCONCLUSIVE at 2 (too few answers for an upper bound), every answer failed at 128 (no latency at all)."""
    return summary_of([level(2, 1.8, 2.0, n=40), level(4, 1.9, 2.5), level(8, 2.0, 3.0), level(16, 2.1, 5.0),
                       level(32, 3.9, 9.0), level(64, 6.0, 16.0, lag_p99=0.2), level(128, 0, 0, n=0, failed=20)])


def png_size(path):
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def png_chunks(path):
    with open(path, "rb") as handle:
        data = handle.read()
    chunks, at = [], 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0] == zlib.crc32(kind + body)
        chunks.append((kind, body))
        at += 12 + length
    assert chunks[-1][0] == b"IEND"
    return chunks


def texts(figure):
    return [t.get_text() for ax in figure.axes for t in ax.texts]


def test_the_summary_has_what_the_plots_must_show(summary):
    verdicts = {lv["concurrency"]: lv["verdict"]["verdict"] for lv in summary["levels"]}
    assert verdicts == {2: "INCONCLUSIVE", 4: "PASS", 8: "PASS", 16: "PASS", 32: "FAIL", 64: "INVALID", 128: "FAIL"}
    assert ("ttft_s.p50", 16, 32) in [(k["metric"], k["from"], k["to"]) for k in summary["knees"]]
    assert summary["recommended_concurrency"] == 16


def gpu_series():
    return {f"node{node}/{gpu}": [(WALL_ZERO + t, float((t * (gpu + 1) + node * 7) % 100)) for t in range(0, 400, 5)]
            for node in (2, 1) for gpu in range(4)}


@pytest.fixture(scope="module")
def rendered(summary, tmp_path_factory):
    return plots.render(summary, str(tmp_path_factory.mktemp("bench") / "plots"), gpu_series=gpu_series())


def test_render_writes_valid_pngs_of_the_stated_size(rendered):
    assert [os.path.basename(p) for p in rendered] == [plots.LATENCY, plots.THROUGHPUT, plots.GPU]
    for path in rendered:
        assert png_size(path) == plots.SIZES[os.path.basename(path)]
        png_chunks(path)
    assert plots.SIZES == {plots.LATENCY: (1000, 800), plots.THROUGHPUT: (1000, 500), plots.GPU: (1200, 500)}


def test_no_gpu_plot_without_samples(summary, tmp_path):
    for n, series in enumerate((None, {"node1/0": []})):
        paths = plots.render(summary, str(tmp_path / str(n)), gpu_series=series)
        assert [os.path.basename(p) for p in paths] == [plots.LATENCY, plots.THROUGHPUT]
        assert sorted(os.listdir(tmp_path / str(n))) == sorted([plots.LATENCY, plots.THROUGHPUT])


def test_the_latency_plot_marks_the_slo_the_knees_the_verdicts_and_hollow_invalid_levels(summary):
    figure = plots.latency_figure(summary)
    ttft, e2e = figure.axes
    assert "SLO P95 E2E <= 12 s" in [t.get_text() for t in e2e.texts]
    assert [t.get_text() for t in ttft.texts] == ["knee 16->32\nelasticity 0.893"]
    words = [t.get_text() for t in e2e.texts]
    assert words.count("PASS") == 3 and words.count("FAIL") == 1 and words.count("FAIL\n(no answers)") == 1
    assert words.count("INVALID") == 1 and words.count("INCONCLUSIVE") == 1
    assert [tick.get_text() for tick in e2e.get_xticklabels()] == ["2", "4", "8", "16", "32", "64", "128"]
    assert e2e.get_xscale() == "log" and e2e.get_ylim()[1] > 12.0
    slo = [line for line in e2e.lines if list(line.get_ydata()) == [12.0, 12.0]]
    assert len(slo) == 1
    for ax, label in ((ttft, "TTFT"), (e2e, "E2E")):
        lines = {line.get_label(): line for line in ax.lines}
        assert {f"{label} P50", f"{label} P95", f"{label} P99"} <= set(lines)
        assert lines[f"{label} P99"].get_linestyle() == "--"
        assert 64 not in list(lines[f"{label} P95"].get_xdata())      # INVALID: off the line
        hollow = [line for line in ax.lines if line.get_markerfacecolor() == "none" and len(line.get_xdata())]
        assert {tuple(line.get_xdata()) for line in hollow} == {(64,)}
    assert len(ttft.patches) == 1 and len(e2e.patches) == len([k for k in summary["knees"]
                                                                  if k["metric"] == "e2e_s.p95"])


def test_error_bars_only_where_a_bound_exists(summary):
    e2e = plots.latency_figure(summary).axes[1]
    bars = e2e.containers
    with_bounds = [lv for lv in summary["levels"]
                   if lv["stats"]["e2e_p95_bounds"]["lower"] is not None
                   or lv["stats"]["e2e_p95_bounds"]["upper"] is not None]
    assert len(bars) == len(with_bounds) == 6
    two = next(lv for lv in summary["levels"] if lv["concurrency"] == 2)["stats"]
    assert two["e2e_p95_bounds"]["upper"] is None and two["e2e_p95_bounds"]["lower"] is not None
    assert [h.get_text() for h in e2e.get_legend().get_texts()].count("P95 E2E 95% bounds") == 1


def test_the_throughput_plot_marks_the_recommended_concurrency_or_its_absence(summary):
    figure = plots.throughput_figure(summary)
    tokens, requests = figure.axes
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert {"output tokens/s", "requests/s", "recommended concurrency 16"} <= set(legend)
    assert [list(line.get_xdata()) for line in tokens.lines if line.get_linestyle() == ":"] == [[16, 16]]
    none = plots.throughput_figure({**summary, "recommended_concurrency": None})
    assert "no level passed: no recommended concurrency" in texts(none)
    assert "qwen2.5-7b-instruct at http://10.0.0.1:8000, http://10.0.0.2:8000" in figure.get_suptitle()


def test_titles_name_the_model_and_a_shortened_target_list(summary):
    many = summary_of(summary["levels"], [f"http://10.0.0.{n}:8000" for n in range(1, 9)])
    title = plots.latency_figure(many).get_suptitle()
    assert title == "revive bench latency: qwen2.5-7b-instruct at http://10.0.0.1:8000, http://10.0.0.2:8000, " \
                    "http://10.0.0.3:8000 +5 more"


def test_the_gpu_plot_has_a_line_per_gpu_and_the_windows_shaded(summary):
    ax = plots.gpu_figure(summary, gpu_series()).axes[0]
    assert [line.get_label() for line in ax.lines] == sorted(gpu_series())
    assert [t.get_text() for t in ax.texts] == [f"c={lv['concurrency']}" for lv in summary["levels"]]
    first = summary["levels"][0]["window"]
    assert ax.lines[0].get_xdata()[0] == pytest.approx(0.0 - first[0])       # x: since the first window opened
    assert len(ax.patches) == len(summary["levels"])
    explicit = plots.gpu_figure(summary, gpu_series(), windows=[(8, WALL_ZERO + 100.0, WALL_ZERO + 130.0)]).axes[0]
    assert [t.get_text() for t in explicit.texts] == ["c=8"]
    assert explicit.patches[0].get_x() == pytest.approx(0.0) and explicit.lines[0].get_xdata()[0] == -100.0


def test_no_figure_is_left_open(rendered):
    assert matplotlib.pyplot.get_fignums() == []


def test_rendering_twice_gives_the_same_bytes_whatever_the_local_style(summary, rendered, tmp_path):
    with matplotlib.rc_context({"lines.linewidth": 6.0, "font.size": 20, "axes.facecolor": "black"}):
        before = dict(matplotlib.rcParams)
        again = plots.render(summary, str(tmp_path), gpu_series=gpu_series())
        assert dict(matplotlib.rcParams) == before                # the local style is left as it was
    assert matplotlib.pyplot.get_fignums() == []
    for a, b in zip(rendered, again, strict=True):
        with open(a, "rb") as one, open(b, "rb") as two:
            assert one.read() == two.read(), a
    for path in rendered:
        text = b"".join(body for kind, body in png_chunks(path) if kind in (b"tEXt", b"iTXt", b"zTXt"))
        assert b"Software" not in text and b"atplotlib" not in text


def block_matplotlib(monkeypatch):
    real = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


def test_without_matplotlib_render_raises_a_clear_plot_error_and_writes_nothing(summary, tmp_path, monkeypatch):
    block_matplotlib(monkeypatch)
    assert plots.available() is False
    with pytest.raises(plots.PlotError, match="need matplotlib, which is not importable here .*controller"):
        plots.render(summary, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    assert plots.available() is True


def test_the_package_imports_with_the_standard_library_only(repo):
    # -S: no site-packages, so no matplotlib; the bench host imports the package as a top-level one
    code = ("import sys; sys.path.insert(0, 'module_utils'); import revive_bench.plots as p, revive_bench.run; "
            "assert not p.available(); print('ok')")
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=repo, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_a_summary_without_levels_is_refused(tmp_path):
    with pytest.raises(plots.PlotError, match="no levels"):
        plots.render(summary_of([]), str(tmp_path))
