"""bench's chart (--plot): what a user decides from, as an SVG a browser shows: each setting's speed-up against the
target alone with its noise band, titled with what was measured on what."""

from __future__ import annotations

from pathlib import Path

from .. import drafting
from .report import band_high, band_low, beyond_noise, noise_words, options_of


def to_svg(doc: dict) -> str:
    """What a user decides from: each setting's speed-up against the target alone (by wall time), a bar from 1.0x
    with its noise band as a whisker, coloured only where the band clears 1.0x; titled with the models, the
    machine and the run's size."""
    rows = [r for r in doc["rows"] if r["category"] == "all" and not drafting.is_plain(r["drafter"])]
    temps = len({r["temp"] for r in rows}) > 1
    names = [options_of(r).replace("--drafter ", "").replace(" --temp", " temp") + (" temp 0" if temps and not r["temp"] else "") for r in rows]  # fmt: skip
    lo = min([1.0] + [band_low(r) for r in rows])
    hi = max([1.0] + [band_high(r) for r in rows])
    step = next(s for s in (0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0) if (hi - lo) / s <= 8)
    bottom, top = _floor(lo - 0.4 * step, step), _floor(hi + 0.4 * step, step) + step  # room for the figures
    band = noise_words(rows)
    models, machine, settings = doc.get("models", {}), doc.get("machine", {}), doc.get("settings", {})
    context = [
        machine.get("cpu"),
        f"{machine['threads']} thread" + ("s" if machine["threads"] > 1 else "") if machine.get("threads") else None,
        f"{settings['prompt_count']} prompts x {settings['max_tokens']} tokens"
        if settings.get("prompt_count")
        else None,
        f"{settings['runs']} run(s) each" if settings.get("runs") else None,
    ]
    lines = [  # (text, font size, colour): the title, the models, the machine and the run's size
        ("speed-up against the target alone, by wall time", 15, "black"),
        (f"target {_name(models.get('target'))}" + (f", draft {_name(models['draft'])}" if models.get("draft") else ""), 12, "#555"),
        (", ".join(part for part in context if part), 12, "#555"),
    ]  # fmt: skip
    notes = [
        f"bar: the median speed-up; whisker: its noise band, {band}",
        "green / red: faster / slower than the target alone beyond the noise; grey: within it",
    ]
    left, right, head, foot = 80, 100, 32 + 18 * len(lines), 110 + 16 * len(notes)  # right: room for 'target alone'
    bar, gap = 36, 18
    text_w = max(len(t) * 0.6 * size for t, size, _ in lines + [(n, 12, "") for n in notes])  # sans-serif, roughly
    w = round(max(480, left + right + len(rows) * (bar + gap) + gap, text_w + 40))
    h = 300 + head + foot
    plot_h = h - head - foot
    spare = (w - left - right) - (len(rows) * (bar + gap) + gap)  # the bars centred in the plot
    y = lambda v: head + plot_h * (top - v) / (top - bottom)  # noqa: E731
    x = lambda i: left + spare / 2 + gap + i * (bar + gap)  # noqa: E731  (a bar's left edge)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
    ]
    for n, (text, size, colour) in enumerate(lines):
        bold = ' font-weight="bold"' if n == 0 else ""
        parts.append(
            f'<text x="{w / 2}" y="{22 + 18 * n}" text-anchor="middle" font-size="{size}" fill="{colour}"{bold}>'
            f"{_esc(text)}</text>"
        )
    for i in range(round((top - bottom) / step) + 1):
        v = bottom + i * step
        parts.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{w - right}" y2="{y(v):.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}x</text>')
    parts += [
        f'<text transform="translate(18 {head + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">'
        "speed-up vs target alone (wall time)</text>",
        f'<line x1="{left}" y1="{head}" x2="{left}" y2="{head + plot_h}" stroke="black"/>',
        f'<line x1="{left}" y1="{y(1):.1f}" x2="{w - right}" y2="{y(1):.1f}" stroke="black" stroke-dasharray="5 3"/>',
        f'<text x="{w - right + 6}" y="{y(1) + 4:.1f}" fill="#333">target alone</text>',
    ]
    colours = {1: "#2e7d32", -1: "#c62828", 0: "#9e9e9e"}  # faster or slower beyond the noise; within it
    for i, (r, name) in enumerate(zip(rows, names)):
        c, mid = colours[beyond_noise(r)], x(i) + bar / 2
        y0, y1 = sorted((y(1), y(r["speedup"])))
        parts.append(f'<rect x="{x(i):.1f}" y="{y0:.1f}" width="{bar}" height="{max(y1 - y0, 1):.1f}" fill="{c}" opacity="0.8"/>')  # fmt: skip
        lo_y, hi_y = y(band_low(r)), y(band_high(r))
        parts.append(f'<line x1="{mid:.1f}" y1="{lo_y:.1f}" x2="{mid:.1f}" y2="{hi_y:.1f}" stroke="black"/>')
        for end in (lo_y, hi_y):
            parts.append(f'<line x1="{mid - 6:.1f}" y1="{end:.1f}" x2="{mid + 6:.1f}" y2="{end:.1f}" stroke="black"/>')
        # the figure beyond the bar's far end and its whisker: above a gain, below a loss
        at = min(hi_y, y(r["speedup"])) - 6 if r["speedup"] >= 1 else max(lo_y, y(r["speedup"])) + 15
        parts.append(f'<text x="{mid:.1f}" y="{at:.1f}" text-anchor="middle">{r["speedup"]:.2f}x</text>')
        parts.append(
            f'<text transform="translate({mid:.1f} {head + plot_h + 14}) rotate(-35)" text-anchor="end">'
            f"{_esc(name)}</text>"
        )
    for n, note in enumerate(notes):
        parts.append(f'<text x="{left}" y="{h - 12 - 16 * (len(notes) - 1 - n)}" fill="#555">{_esc(note)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _floor(v: float, step: float) -> float:
    return step * int(v / step + 1e-9) if v >= 0 else -step * int(-v / step + 1 - 1e-9)


def _name(path: str | None) -> str:
    return Path(path).name if path else "?"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
