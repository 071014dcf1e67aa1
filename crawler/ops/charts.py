"""Charts of a crawl (``crawler stats SITE --plot FILE``): requests and latency over time.

Two formats, chosen by FILE's suffix: ``.html``, one self-contained file whose charts
are inline SVG drawn here (no script, nothing fetched when it is opened), and ``.png``,
drawn by matplotlib, an optional dependency (``pip install 'crawler[plot]'``) imported
only when a PNG is asked for, so the CLI starts as fast without it.
"""

from __future__ import annotations

import html
import importlib.util
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..store.database import Store
from .stats import SERIES_OUTCOMES, SiteStats, TimeSeries, download_rows, summarize, time_series

#: The suffixes ``--plot`` writes.
FORMATS = (".html", ".png")

#: The one line a PNG report without matplotlib gets.
NEEDS_MATPLOTLIB = "a PNG report needs matplotlib: pip install 'crawler[plot]', or write an .html report"

#: Fill colour of each outcome group (colour-blind-safe Okabe-Ito hues), and of the latency lines.
COLORS = {
    "ok": "#009e73",
    "retry": "#e69f00",
    "failed": "#d55e00",
    "other": "#999999",
    "p50": "#0072b2",
    "p95": "#cc79a7",
}

#: Size of one SVG chart in CSS pixels, and its margins around the plot area.
CHART_WIDTH, CHART_HEIGHT = 960, 280
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 72, 36, 40, 46  # right: room for the last time label

#: Steps the time axis picks from, in seconds: the shortest that gives at most MAX_TIME_TICKS labels.
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)
MAX_TIME_TICKS = 8


@dataclass
class SiteReport:
    """What the report shows of one site: the ``crawler stats`` summary and the time series."""

    stats: SiteStats
    series: TimeSeries


def check_plot_path(path: str | Path) -> str:
    """The format (``.html`` or ``.png``) ``path`` asks for; ConfigError for any other suffix,
    or for ``.png`` when matplotlib is not installed."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ConfigError(f"--plot FILE must end in .html or .png, not {str(path)!r}")
    if suffix == ".png" and importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(NEEDS_MATPLOTLIB)
    return suffix


def site_reports(store: Store, sites: Iterable[str]) -> list[SiteReport]:
    """A report for each site, in the order given; ConfigError for a site with no downloads."""
    reports = []
    for site in sites:
        rows = download_rows(store, site)
        if not rows:
            raise ConfigError(f"no downloads recorded for site {site!r}: nothing to plot")
        reports.append(SiteReport(summarize(site, rows), time_series(site, rows)))
    return reports


def write_report(path: str | Path, reports: list[SiteReport]) -> None:
    """Write ``reports`` to ``path`` in the format its suffix names (see ``check_plot_path``)."""
    suffix = check_plot_path(path)
    try:
        if suffix == ".html":
            Path(path).write_text(render_html(reports), encoding="utf-8")
        else:
            _write_png(path, reports)
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


# -- HTML -------------------------------------------------------------------------------------

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 24px auto; max-width: 1000px; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 36px; border-bottom: 1px solid #ddd; }
svg.chart { width: 100%; height: auto; display: block; margin: 12px 0; }
svg text { font: 12px system-ui, sans-serif; fill: #333; } svg .title { font-size: 14px; font-weight: 600; }
svg .grid { stroke: #e6e6e6; } svg .axis { stroke: #666; }
table { border-collapse: collapse; } td, th { padding: 2px 10px 2px 0; text-align: left; }
td.num, th.num { text-align: right; } .muted { color: #666; }
"""


def render_html(reports: list[SiteReport]) -> str:
    """One self-contained HTML page: per site, a title with its time range, the summary
    numbers, a stacked bar chart of requests by outcome and a line chart of p50/p95 latency."""
    names = ", ".join(r.stats.site for r in reports)
    body = "\n".join(_site_section(report) for report in reports)
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>Crawl report: {_esc(names)}</title>\n<style>{_STYLE}</style></head>\n"
        f"<body>\n<h1>Crawl report: {_esc(names)}</h1>\n{body}\n</body></html>\n"
    )


def _site_section(report: SiteReport) -> str:
    stats, series = report.stats, report.series
    lat = stats.latency
    slowest = "".join(
        f'<tr><td>{_esc(row["url"])}</td><td class="num">{row["elapsed"]:.3f}</td>'
        f'<td class="num">{_esc(row["status"])}</td></tr>'
        for row in stats.slowest
    )
    return f"""<section class="site">
<h2>{_esc(stats.site)}: {_esc(time_range(series.first, series.last))}</h2>
<p class="summary">{stats.downloads} downloads; latency p50 {_ms(lat["p50"])}, p90 {_ms(lat["p90"])},
p99 {_ms(lat["p99"])}, max {_ms(lat["max"])} (downloads that got an answer)<br>
outcomes: {_esc(", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())))}<br>
statuses: {_esc(", ".join(f"{k} {v}" for k, v in stats.statuses.items()))}<br>
<span class="muted">one bucket = {duration(series.bucket_seconds)}; each download counts in the bucket its request
started in</span></p>
{requests_svg(series)}
{latency_svg(series)}
<table class="slowest"><tr><th>slowest</th><th class="num">seconds</th><th class="num">status</th></tr>{slowest}</table>
</section>"""


@dataclass
class _Frame:
    """A chart's plot area: time (epoch seconds) t0..t1 across, values 0..top up."""

    t0: float
    t1: float
    top: float

    left, right = MARGIN_LEFT, CHART_WIDTH - MARGIN_RIGHT
    upper, lower = MARGIN_TOP, CHART_HEIGHT - MARGIN_BOTTOM

    def x(self, t: float) -> float:
        return self.left + (t - self.t0) / (self.t1 - self.t0) * (self.right - self.left)

    def y(self, value: float) -> float:
        return self.lower - value / self.top * (self.lower - self.upper)


def requests_svg(series: TimeSeries) -> str:
    """Stacked bars: downloads per bucket by outcome group, one ``rect.bar`` per non-zero group."""
    size = series.bucket_seconds
    ticks, top = nice_ticks(max(sum(b.requests.values()) for b in series.buckets), whole=True)
    frame = _frame(series, top)
    parts = []
    for bucket in series.buckets:
        t = bucket.start.timestamp()
        x0, x1 = frame.x(t), frame.x(t + size)
        gap = min(2.0, (x1 - x0) * 0.15)  # bars of adjacent buckets stay apart, even when narrow
        stacked = 0
        for outcome in SERIES_OUTCOMES:
            count = bucket.requests[outcome]
            if not count:
                continue
            y_top, y_bottom = frame.y(stacked + count), frame.y(stacked)
            label = f"{_clock(bucket.start)} UTC: {count} {outcome}"
            parts.append(
                f'<rect class="bar {outcome}" x="{x0 + gap / 2:.1f}" y="{y_top:.1f}" '
                f'width="{max(x1 - x0 - gap, 0.5):.1f}" height="{y_bottom - y_top:.1f}" '
                f'fill="{COLORS[outcome]}"><title>{_esc(label)}</title></rect>'
            )
            stacked += count
    title = f"Requests per {duration(size)}, by outcome"
    return _svg("requests", frame, title, f"requests / {duration(size)}", ticks, "{:g}", parts, list(SERIES_OUTCOMES))


def latency_svg(series: TimeSeries) -> str:
    """p50 and p95 download latency per bucket: one ``circle.p50``/``circle.p95`` per bucket with
    answered downloads, joined by ``polyline`` runs that break where a bucket has none."""
    peak = max((b.p95 for b in series.buckets if b.p95 is not None), default=0.0)
    unit, scale = ("ms", 1000.0) if peak < 2 else ("s", 1.0)
    ticks, top = nice_ticks(peak * scale)
    frame = _frame(series, top)
    parts = []
    for name in ("p50", "p95"):
        runs: list[list[str]] = [[]]
        for bucket in series.buckets:
            value = getattr(bucket, name)
            if value is None:
                runs.append([])
                continue
            x = frame.x(bucket.start.timestamp() + series.bucket_seconds / 2)
            y = frame.y(value * scale)
            runs[-1].append(f"{x:.1f},{y:.1f}")
            label = f"{_clock(bucket.start)} UTC: {name} {value * scale:.4g} {unit}"
            parts.append(
                f'<circle class="point {name}" cx="{x:.1f}" cy="{y:.1f}" r="2.5" '
                f'fill="{COLORS[name]}"><title>{_esc(label)}</title></circle>'
            )
        parts += [
            f'<polyline class="line {name}" points="{" ".join(run)}" fill="none" stroke="{COLORS[name]}" '
            f'stroke-width="1.5"/>'
            for run in runs
            if len(run) > 1
        ]
    title = f"Download latency per {duration(series.bucket_seconds)} (of downloads that got an answer)"
    return _svg("latency", frame, title, f"latency ({unit})", ticks, "{:g}", parts, ["p50", "p95"])


def _frame(series: TimeSeries, top: float) -> _Frame:
    start = series.buckets[0].start.timestamp()
    return _Frame(start, series.buckets[-1].start.timestamp() + series.bucket_seconds, top)


def _svg(
    kind: str,
    frame: _Frame,
    title: str,
    y_label: str,
    y_ticks: list[float],
    y_format: str,
    marks: list[str],
    legend: list[str],
) -> str:
    parts = [f'<text class="title" x="{frame.left}" y="18">{_esc(title)}</text>']
    for value in y_ticks:
        y = frame.y(value)
        parts.append(f'<line class="grid" x1="{frame.left}" x2="{frame.right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(
            f'<text class="tick y" x="{frame.left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{y_format.format(value)}</text>"
        )
    for t, label in time_ticks(frame.t0, frame.t1):
        x = frame.x(t)
        parts.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{frame.lower}" y2="{frame.lower + 4}"/>')
        parts.append(f'<text class="tick x" x="{x:.1f}" y="{frame.lower + 17}" text-anchor="middle">{label}</text>')
    parts += marks
    parts.append(f'<line class="axis" x1="{frame.left}" x2="{frame.right}" y1="{frame.lower}" y2="{frame.lower}"/>')
    parts.append(f'<line class="axis" x1="{frame.left}" x2="{frame.left}" y1="{frame.upper}" y2="{frame.lower}"/>')
    middle = (frame.upper + frame.lower) / 2
    parts.append(
        f'<text class="label y" x="16" y="{middle:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {middle:.1f})">{_esc(y_label)}</text>'
    )
    parts.append(
        f'<text class="label x" x="{(frame.left + frame.right) / 2:.1f}" y="{CHART_HEIGHT - 6}" '
        f'text-anchor="middle">time (UTC)</text>'
    )
    x = frame.right - 78 * len(legend)
    for name in legend:
        parts.append(
            f'<rect class="key" x="{x}" y="8" width="12" height="12" fill="{COLORS[name]}"/>'
            f'<text class="key" x="{x + 17}" y="18">{name}</text>'
        )
        x += 78
    return (
        f'<svg class="chart {kind}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" '
        f'width="{CHART_WIDTH}" height="{CHART_HEIGHT}" role="img" aria-label="{_esc(title)}">\n'
        + "\n".join(parts)
        + "\n</svg>"
    )


def nice_ticks(peak: float, whole: bool = False, most: int = 5) -> tuple[list[float], float]:
    """Axis ticks from 0 up to at least ``peak``, a step of 1, 2, 2.5 or 5 × 10^k, at most
    ``most`` steps (whole numbers only when ``whole``); also the axis top (the last tick)."""
    if peak <= 0:
        return [0.0, 1.0], 1.0
    rough = peak / most
    magnitude = 10 ** math.floor(math.log10(rough))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= rough)
    if whole:
        step = max(1.0, math.ceil(step))
    count = math.ceil(peak / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)], round(count * step, 10)


def time_ticks(t0: float, t1: float) -> list[tuple[float, str]]:
    """Labelled ticks (epoch seconds, UTC label) at whole multiples of a step from TIME_STEPS,
    at most MAX_TIME_TICKS of them between ``t0`` and ``t1``."""
    step = next((s for s in TIME_STEPS if (t1 - t0) / s <= MAX_TIME_TICKS), TIME_STEPS[-1])
    if t1 - t0 > 86400:
        form = "%m-%d %H:%M"
    else:
        form = "%H:%M:%S" if step < 60 else "%H:%M"
    first = math.ceil(t0 / step) * step
    return [(t, datetime.fromtimestamp(t, UTC).strftime(form)) for t in range(int(first), int(t1) + 1, step)]


def time_range(first: datetime, last: datetime) -> str:
    """``first`` to ``last`` in UTC, the date said once when both fall on the same day."""
    start = first.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    end = last.astimezone(UTC).strftime("%H:%M:%S" if first.date() == last.date() else "%Y-%m-%d %H:%M:%S")
    return f"{start} to {end} UTC"


def duration(seconds: int) -> str:
    """A bucket size in words: ``5 s``, ``1 min``, ``3 h``, ``1 day``."""
    for unit, length in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{seconds // length} {unit}"
    return f"{seconds} s"


def _clock(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _esc(value: object) -> str:
    return html.escape(str(value))


# -- PNG --------------------------------------------------------------------------------------


def _write_png(path: str | Path, reports: list[SiteReport]) -> None:
    try:  # here, not at the top: the CLI must not pay for matplotlib unless a PNG is asked for
        from matplotlib import dates as mdates
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(NEEDS_MATPLOTLIB) from None
    figure = Figure(figsize=(11, 7 * len(reports)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)  # Agg, whatever backend the user's matplotlibrc names
    subfigures = figure.subfigures(len(reports), 1, squeeze=False)[:, 0]
    for report, subfigure in zip(reports, subfigures, strict=True):
        stats, series = report.stats, report.series
        lat = stats.latency
        subfigure.suptitle(
            f"{stats.site}: {time_range(series.first, series.last)}\n"
            f"{stats.downloads} downloads; latency p50 {_ms(lat['p50'])}, p90 {_ms(lat['p90'])}, "
            f"p99 {_ms(lat['p99'])}, max {_ms(lat['max'])}",
            fontsize=12,
        )
        requests_ax, latency_ax = subfigure.subplots(2, 1, sharex=True)
        _plot_requests(requests_ax, series, mdates)
        _plot_latency(latency_ax, series)
        locator = mdates.AutoDateLocator(tz=UTC)
        latency_ax.xaxis.set_major_locator(locator)
        latency_ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
        latency_ax.set_xlabel("time (UTC)")
    figure.savefig(path, format="png")


def _plot_requests(ax: Any, series: TimeSeries, mdates: Any) -> None:
    size = series.bucket_seconds
    starts = [b.start for b in series.buckets]
    bottom = [0] * len(starts)
    for outcome in SERIES_OUTCOMES:
        counts = [b.requests[outcome] for b in series.buckets]
        ax.bar(
            mdates.date2num(starts),
            counts,
            width=size / 86400 * 0.85,
            bottom=bottom,
            align="edge",
            color=COLORS[outcome],
            label=outcome,
        )
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_title(f"Requests per {duration(size)}, by outcome", loc="left", fontsize=11)
    ax.set_ylabel(f"requests / {duration(size)}")
    ax.legend(loc="lower right", bbox_to_anchor=(1, 1), ncols=4, fontsize=9, frameon=False)  # above, not on, the bars
    ax.set_ylim(0, max(bottom) * 1.08 or 1)  # the tallest bar clear of the frame
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(axis="y", color="#e6e6e6")
    ax.set_axisbelow(True)


def _plot_latency(ax: Any, series: TimeSeries) -> None:
    peak = max((b.p95 for b in series.buckets if b.p95 is not None), default=0.0)
    unit, scale = ("ms", 1000.0) if peak < 2 else ("s", 1.0)
    centers = [datetime.fromtimestamp(b.start.timestamp() + series.bucket_seconds / 2, UTC) for b in series.buckets]
    for name in ("p50", "p95"):
        values = [math.nan if getattr(b, name) is None else getattr(b, name) * scale for b in series.buckets]
        ax.plot(centers, values, marker="o", markersize=3, linewidth=1.5, color=COLORS[name], label=name)
    title = f"Download latency per {duration(series.bucket_seconds)} (of downloads that got an answer)"
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_ylabel(f"latency ({unit})")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", bbox_to_anchor=(1, 1), ncols=2, fontsize=9, frameon=False)
    ax.grid(axis="y", color="#e6e6e6")
