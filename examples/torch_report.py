"""An HTML report of a training run, with SVG plots and no dependencies: the loss curve, each
step's time split into compute / stall / optimizer, and the bytes each tier held over time.

``write_html(path, title, summary, steps, curves=None)`` writes it; ``steps`` is a list of
dicts with ``step``, ``loss``, ``compute_s``, ``stall_s``, ``optimizer_s``, ``tiers`` ({name:
bytes}) and optionally ``val_loss``; ``curves`` ({name: [(step, held-out loss), ...]}), when
given, adds a chart of those curves together (the runs of ``--accuracy``, one per state dtype). The page measures its own drawing once laid out (each chart's marks
and their bounding box, in ``<pre id="layout">``), so a headless browser can check it.
"""
from __future__ import annotations

import html
import json
import math
from typing import Iterable, Sequence

__all__ = ["write_html"]

_W, _H, _PAD = 640, 240, 48
_COLOURS = ("#3b6fb6", "#d9822b", "#4c9f50", "#9b59b6", "#c0392b", "#7f8c8d")

_SELF_CHECK = """
window.addEventListener('load', () => {
  const out = {};
  for (const svg of document.querySelectorAll('svg[data-chart]')) {
    const marks = svg.querySelectorAll('[data-mark]');
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
    for (const m of marks) {
      const b = m.getBBox();
      x0 = Math.min(x0, b.x); y0 = Math.min(y0, b.y);
      x1 = Math.max(x1, b.x + b.width); y1 = Math.max(y1, b.y + b.height);
    }
    const box = svg.getBoundingClientRect();
    out[svg.dataset.chart] = {marks: marks.length, drawn: [x0, y0, x1, y1],
                              shown: [box.width, box.height]};
  }
  document.getElementById('layout').textContent = JSON.stringify(out);
});
"""


def _finite(values: Iterable[float]) -> list:
    return [v for v in values if v is not None and math.isfinite(v)]


class _Axes:
    """Maps data to the plot area [PAD, W - PAD/2] x [H - PAD, PAD/2]."""

    def __init__(self, xmax: float, ymin: float, ymax: float):
        self.xmax = max(xmax, 1e-12)
        self.ymin, self.ymax = ymin, ymax if ymax > ymin else ymin + 1.0

    def x(self, v: float) -> float:
        return _PAD + (_W - 1.5 * _PAD) * v / self.xmax

    def y(self, v: float) -> float:
        return _H - _PAD - (_H - 1.5 * _PAD) * (v - self.ymin) / (self.ymax - self.ymin)

    def frame(self, xlabel: str, ylabel: str, yfmt) -> list:
        parts = [f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD / 2}" y2="{_H - _PAD}" '
                 'stroke="#444"/>',
                 f'<line x1="{_PAD}" y1="{_PAD / 2}" x2="{_PAD}" y2="{_H - _PAD}" stroke="#444"/>']
        for i in range(5):
            v = self.ymin + (self.ymax - self.ymin) * i / 4
            parts.append(f'<text x="{_PAD - 4}" y="{self.y(v) + 4:.1f}" text-anchor="end" '
                         f'font-size="10">{html.escape(yfmt(v))}</text>')
        parts.append(f'<text x="{(_W + _PAD) / 2}" y="{_H - 12}" text-anchor="middle" '
                     f'font-size="11">{html.escape(xlabel)}</text>')
        parts.append(f'<text x="12" y="{_H / 2}" font-size="11" transform="rotate(-90 12 '
                     f'{_H / 2})" text-anchor="middle">{html.escape(ylabel)}</text>')
        return parts


def _legend(names: Sequence[str]) -> list:
    parts = []
    for i, name in enumerate(names):
        x = _PAD + 8 + 150 * i
        parts.append(f'<rect x="{x}" y="6" width="10" height="10" '
                     f'fill="{_COLOURS[i % len(_COLOURS)]}"/>')
        parts.append(f'<text x="{x + 14}" y="15" font-size="11">{html.escape(name)}</text>')
    return parts


def _svg(chart: str, title: str, body: list) -> str:
    return (f'<figure><figcaption>{html.escape(title)}</figcaption>'
            f'<svg data-chart="{chart}" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
            f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{html.escape(title)}">'
            + "".join(body) + "</svg></figure>")


def _loss_chart(steps: list) -> str:
    xs = [s["step"] for s in steps]
    train = [s["loss"] for s in steps]
    val = [(s["step"], s["val_loss"]) for s in steps if s.get("val_loss") is not None]
    values = _finite(train + [v for _, v in val])
    if not values:
        raise ValueError("write_html: no finite loss to plot")
    ax = _Axes(max(xs), min(0.0, min(values)), max(values) * 1.05)
    body = ax.frame("step", "loss", lambda v: f"{v:.2f}")
    points = " ".join(f"{ax.x(x):.1f},{ax.y(v):.1f}" for x, v in zip(xs, train)
                      if math.isfinite(v))
    body.append(f'<polyline data-mark="train" points="{points}" fill="none" '
                f'stroke="{_COLOURS[0]}" stroke-width="1.5"/>')
    for x, v in val:
        body.append(f'<circle data-mark="val" cx="{ax.x(x):.1f}" cy="{ax.y(v):.1f}" r="3" '
                    f'fill="{_COLOURS[1]}"><title>step {x}: held-out loss {v:.4f}</title>'
                    '</circle>')
    body += _legend(["training loss"] + (["held-out loss"] if val else []))
    return _svg("loss", "Loss", body)


def _time_chart(steps: list) -> str:
    parts = ("compute_s", "stall_s", "optimizer_s")
    totals = [sum(max(s[p], 0.0) for p in parts) for s in steps]
    ax = _Axes(len(steps), 0.0, max(totals) * 1.05 * 1e3)
    body = ax.frame("step", "ms", lambda v: f"{v:.0f}")
    width = max((_W - 1.5 * _PAD) / len(steps) - 1, 0.5)
    for i, s in enumerate(steps):
        base = 0.0
        for k, p in enumerate(parts):
            v = max(s[p], 0.0) * 1e3
            if v > 0:
                top, bottom = ax.y(base + v), ax.y(base)
                body.append(f'<rect data-mark="{p}" x="{ax.x(i):.1f}" y="{top:.1f}" '
                            f'width="{width:.1f}" height="{bottom - top:.2f}" '
                            f'fill="{_COLOURS[k]}"><title>step {s["step"]}: {p[:-2]} '
                            f'{v:.1f} ms</title></rect>')
            base += v
    body += _legend(["compute", "stall", "optimizer"])
    return _svg("time", "Each step's time: compute, stall waiting for staging, optimizer", body)


def _tier_chart(steps: list) -> str:
    names = sorted({t for s in steps for t in s["tiers"]})
    top = max((b for s in steps for b in s["tiers"].values()), default=1)
    ax = _Axes(max(s["step"] for s in steps), 0.0, top * 1.1 / 2**20)
    body = ax.frame("step", "MiB", lambda v: f"{v:.1f}")
    for k, name in enumerate(names):
        points = " ".join(f"{ax.x(s['step']):.1f},{ax.y(s['tiers'].get(name, 0) / 2**20):.1f}"
                          for s in steps)
        body.append(f'<polyline data-mark="{html.escape(name)}" points="{points}" fill="none" '
                    f'stroke="{_COLOURS[k % len(_COLOURS)]}" stroke-width="2"/>')
    body += _legend(names)
    return _svg("tiers", "Bytes each tier held", body)


def _curves_chart(curves: dict) -> str:
    """Held-out loss curves of several runs on one plot, a line and its points per run."""
    values = _finite(v for points in curves.values() for _, v in points)
    if not values:
        raise ValueError("write_html: no finite held-out loss in curves")
    lo, hi = min(values), max(values)
    margin = 0.05 * (hi - lo) or 0.05 * abs(hi) or 1.0
    ax = _Axes(max(x for points in curves.values() for x, _ in points), lo - margin, hi + margin)
    body = ax.frame("step", "held-out loss", lambda v: f"{v:.3f}")
    for k, (name, points) in enumerate(curves.items()):
        colour = _COLOURS[k % len(_COLOURS)]
        shown = [(x, v) for x, v in points if v is not None and math.isfinite(v)]
        line = " ".join(f"{ax.x(x):.1f},{ax.y(v):.1f}" for x, v in shown)
        body.append(f'<polyline data-mark="{html.escape(name)}" points="{line}" fill="none" '
                    f'stroke="{colour}" stroke-width="1.5"><title>{html.escape(name)}</title>'
                    '</polyline>')
        for x, v in shown:
            body.append(f'<circle cx="{ax.x(x):.1f}" cy="{ax.y(v):.1f}" r="2" fill="{colour}">'
                        f'<title>{html.escape(name)}, step {x}: {v:.4f}</title></circle>')
    body += _legend(list(curves))
    return _svg("curves", "Held-out loss of each run (the same model, seed and data)", body)


def write_html(path: str, title: str, summary: Sequence[str], steps: list,
               curves: dict = None) -> None:
    """Writes the report to ``path`` (see the module's comment)."""
    if not steps:
        raise ValueError("write_html: no steps to plot")
    if curves is not None and not any(curves.values()):
        raise ValueError("write_html: curves holds no points")
    for i, s in enumerate(steps):
        for key in ("step", "loss", "compute_s", "stall_s", "optimizer_s", "tiers"):
            if key not in s:
                raise ValueError(f"write_html: steps[{i}] has no {key!r}")
    page = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:700px;margin:2em auto}"
        "figure{margin:1.5em 0}figcaption{font-weight:bold}"
        "pre#layout{display:none}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<ul id=\"summary\">" + "".join(f"<li>{html.escape(line)}</li>" for line in summary)
        + "</ul>",
        *([_curves_chart(curves)] if curves else []),
        _loss_chart(steps), _time_chart(steps), _tier_chart(steps),
        "<details><summary>Steps (JSON)</summary><pre id=\"steps\">"
        + html.escape(json.dumps(steps)) + "</pre></details>",
        "<pre id=\"layout\"></pre>",
        f"<script>{_SELF_CHECK}</script></body></html>",
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(page))
