#!/usr/bin/env python3
"""Line plots of CSV columns as a standalone SVG, with the standard library
only (so `benches/scale.sh` needs nothing beyond python3).

    plot_svg.py CSV OUT.svg --x COL --y COL[,COL...] [--title T]
                [--xlabel L] [--ylabel L] [--logx] [--logy]

Each y column is one series, drawn with its points marked and labelled
with their values. Rows are plotted in file order.
"""

import argparse
import csv
import math
import sys
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 80, 170, 50, 60
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def fmt(v):
    """A short label for a value: 3 significant figures, thousands spaced."""
    if v == 0:
        return "0"
    if abs(v) >= 1000 or v == int(v):
        return f"{v:,.0f}".replace(",", " ")
    digits = max(0, 2 - int(math.floor(math.log10(abs(v)))))
    return f"{v:.{digits}f}"


def log_ticks(lo, hi):
    """1, 2 and 5 times the powers of ten in [lo, hi]; or only the powers,
    when the range spans more than two decades."""
    mult = (1, 2, 5) if hi / lo <= 100 else (1,)
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        out += [m * 10.0**e for m in mult if lo <= m * 10.0**e <= hi]
    return out


def ticks(lo, hi, log):
    span = hi - lo or abs(hi) or 1.0
    step = 10 ** math.floor(math.log10(span / 5))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= 6:
            step *= m
            break
    first = math.floor(lo / step) * step
    out, t = [], first
    while t <= hi + step * 1e-9:
        out.append(round(t, 12))
        t += step
    return out


def scale(lo, hi, log, a, b):
    """Map [lo, hi] (log or linear) onto pixels [a, b]."""
    if log:
        lo, hi = math.log10(lo), math.log10(hi)
    span = (hi - lo) or 1.0

    def f(v):
        v = math.log10(v) if log else v
        return a + (v - lo) / span * (b - a)

    return f


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("out")
    p.add_argument("--x", required=True)
    p.add_argument("--y", required=True, help="comma-separated columns")
    p.add_argument("--title", default="")
    p.add_argument("--xlabel", default=None)
    p.add_argument("--ylabel", default="")
    p.add_argument("--logx", action="store_true")
    p.add_argument("--logy", action="store_true")
    a = p.parse_args()

    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{a.csv}: no rows")
    ycols = a.y.split(",")
    for col in [a.x] + ycols:
        if col not in rows[0]:
            sys.exit(f"{a.csv}: no column {col!r} (have {', '.join(rows[0])})")
    xs = [float(r[a.x]) for r in rows]
    series = {c: [float(r[c]) for r in rows] for c in ycols}
    allys = [v for s in series.values() for v in s]

    # Log axes span the data with a margin; linear ones run from tick to
    # tick, y from zero so growth reads as a ratio.
    if a.logx:
        xlo, xhi = min(xs) / 1.25, max(xs) * 1.25
        xt = log_ticks(xlo, xhi)
    else:
        xt = ticks(min(xs), max(xs), False)
        xlo, xhi = xt[0], xt[-1]
    if a.logy:
        ylo, yhi = min(allys) / 1.25, max(allys) * 1.25
        yt = log_ticks(ylo, yhi)
    else:
        yt = ticks(0.0, max(allys) * 1.08, False)
        ylo, yhi = yt[0], yt[-1]

    px = scale(xlo, xhi, a.logx, LEFT, WIDTH - RIGHT)
    py = scale(ylo, yhi, a.logy, HEIGHT - BOTTOM, TOP)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="15">{escape(a.title)}</text>',
    ]
    for t in xt:
        x = px(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle">{fmt(t)}</text>')
    for t in yt:
        y = py(t)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    out.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" '
        f'fill="none" stroke="#333"/>'
    )
    xlabel = a.xlabel if a.xlabel is not None else a.x
    out.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 18}" text-anchor="middle">'
        f'{escape(xlabel + (" (log scale)" if a.logx else ""))}</text>'
    )
    out.append(
        f'<text transform="translate(20 {(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">'
        f'{escape(a.ylabel + (" (log scale)" if a.logy else ""))}</text>'
    )
    for i, (col, ys) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in zip(xs, ys):
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}"/>')
            out.append(
                f'<text x="{px(x) + 5:.1f}" y="{py(y) - 7:.1f}" fill="{colour}" font-size="10">{fmt(y)}</text>'
            )
        ly = TOP + 10 + 20 * i
        lx = WIDTH - RIGHT + 12
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 20}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{lx + 26}" y="{ly + 4}">{escape(col)}</text>')
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
