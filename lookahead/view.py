"""Where the drafts came from: a call's written text with each kept drafted token marked by its source.

`render(stats, tokenizer)` (what `DraftStats.render` calls) prints the text a generate call wrote,
each span of kept drafted tokens coloured by where it was copied from (ANSI colours in a
terminal, `[p|...]`-style markers elsewhere), and can write a self-contained HTML page: a legend,
the tokens each forward pass wrote as bars along the text, and the text with each forward pass
underlined (its tooltip says how many tokens it wrote). Reads DraftStats' per-token record
(token_ids, token_sources, token_steps); numpy only.
"""

import html as html_escape
import sys
from pathlib import Path

import numpy as np

from lookahead.sources import MODEL, SOURCES

# Per source: the page's colour, the terminal's (an xterm-256 background), the marker without colour, what it means.
STYLE = {
    "model": ("#ffffff", None, "", "the model's own token: one per forward pass"),
    "prompt": ("#7fb2ff", 111, "p", "copied from the prompt"),
    "output": ("#6fdc7f", 114, "o", "copied from the output so far"),
    "documents": ("#e59af2", 177, "d", "copied from a reference document"),
    "memory": ("#ffcf57", 221, "m", "copied from what an earlier request wrote (memory)"),
    "predictions": ("#5fdede", 80, "t", "the model's own predictions at earlier steps (its prediction table)"),
    "other": ("#c4c4c4", 250, "?", "a draft with no source (a loop's guess)"),
}
assert tuple(STYLE) == SOURCES


def segments(stats, tokenizer) -> list[tuple[str, int, int]]:
    """(text, source code, step) per run of written tokens sharing a source and a step, in order; their texts
    join to tokenizer.decode(stats.token_ids).

    Each run's text is the decoded prefix up to its end less the one before; where that prefix is not a
    prefix of the whole text (a character split across tokens, a tokenizer that cleans up spaces), the
    run joins the next one (and keeps its own source and step). Cost: one decode per run.
    """
    ids, sources, steps = stats.token_ids, stats.token_sources, stats.token_steps
    n = ids.shape[0]
    if n == 0:
        return []
    starts = np.flatnonzero(np.r_[True, (sources[1:] != sources[:-1]) | (steps[1:] != steps[:-1])])
    ends = np.r_[starts[1:], n]
    id_list = ids.tolist()
    whole = tokenizer.decode(id_list)
    runs, done, first = [], 0, None  # done: characters of `whole` already in runs; first: the pending run's start
    for start, end in zip(starts.tolist(), ends.tolist()):
        first = start if first is None else first
        text = whole if end == n else tokenizer.decode(id_list[:end])
        if end < n and (len(text) < done or not whole.startswith(text)):
            continue
        runs.append((whole[done : len(text)], int(sources[first]), int(steps[first])))
        done, first = len(text), None
    return runs


def terminal_text(runs, *, color: bool) -> str:
    """The runs as one string: drafted runs on their source's ANSI background, or as [mark|text] without colour."""
    parts = []
    for text, source, _ in runs:
        if source == MODEL or not text:
            parts.append(text)
            continue
        _, code, mark, _ = STYLE[SOURCES[source]]
        if color:  # coloured line by line: a background never runs past a line break
            parts.append("\n".join(f"\x1b[48;5;{code}m\x1b[30m{line}\x1b[0m" if line else line for line in text.split("\n")))
        else:
            parts.append(f"[{mark}|{text}]")
    return "".join(parts)


def legend(stats, *, color: bool) -> str:
    """One line: each source that had tokens kept, as it is marked, and what it means."""
    kept = {name for name, (_, k) in stats.by_source.items() if k}
    items = []
    for name in SOURCES[1:]:
        if name in kept:
            _, code, mark, meaning = STYLE[name]
            items.append(f"\x1b[48;5;{code}m\x1b[30m {name} \x1b[0m {meaning}" if color else f"[{mark}|...] {meaning}")
    return "; ".join(items + ["unmarked: the model's own tokens"])


def page(stats, runs, *, title: str = "Where the drafts came from") -> str:
    """A self-contained HTML page: the stats in words, a legend, tokens per forward pass, the marked text."""
    esc = html_escape.escape
    css = [
        "body{font:15px/1.5 system-ui,sans-serif;margin:24px;max-width:960px;color:#111;background:#fff}",
        "h1{font-size:20px;margin:0 0 8px} h2{font-size:15px;margin:18px 0 6px}",
        ".legend span.key{display:inline-block;padding:0 8px;margin:2px 4px 2px 0;border:1px solid #888;border-radius:3px}",
        ".bars{display:flex;align-items:flex-end;gap:1px;height:90px;border-bottom:1px solid #888;overflow-x:auto}",
        ".bar{display:flex;flex-direction:column-reverse;flex:none}",
        ".text{white-space:pre-wrap;font:15px/2.2 ui-monospace,Menlo,Consolas,monospace}",
        ".step{border-bottom:3px solid #222;padding-bottom:1px} .step.odd{border-bottom-color:#aaa}",
    ]
    css += [f".src-{name}{{background:{STYLE[name][0]}}}" for name in SOURCES if name != "model"]
    css.append(".src-model{background:#e8e8e8}")  # in the bars only: the text leaves the model's tokens unmarked
    kept = {name for name, (_, k) in stats.by_source.items() if k}
    keys = [f'<span class="key src-{name}">{name}</span>{esc(STYLE[name][3])}' for name in SOURCES[1:] if name in kept]
    keys.append(f'<span class="key">plain</span>{esc(STYLE["model"][3])}; each forward pass is underlined, dark and light in turn')

    steps, sources = stats.token_steps, stats.token_sources
    bars = []
    if steps.shape[0]:
        first_step = int(steps[0])
        per_step = np.zeros((int(steps[-1]) - first_step + 1, len(SOURCES)), dtype=np.int64)
        np.add.at(per_step, (steps - first_step, sources.astype(np.int64)), 1)
        tallest = max(int(per_step.sum(axis=1).max()), 1)
        width = min(24, max(3, 900 // per_step.shape[0] - 1))  # px per bar: the row fills about 900 px, within 3..24
        for i, counts in enumerate(per_step.tolist()):
            blocks = "".join(f'<div class="src-{SOURCES[s]}" style="height:{80 * c / tallest:.1f}px"></div>'
                             for s, c in enumerate(counts) if c)
            bars.append(f'<div class="bar" style="width:{width}px" title="forward pass {first_step + i + 1}: {sum(counts)} tokens">'
                        f'{blocks}</div>')

    text, open_step = [], None
    tokens_in = np.bincount(steps) if steps.shape[0] else np.zeros(0, dtype=np.int64)
    for piece, source, step in runs:
        if step != open_step:
            if open_step is not None:
                text.append("</span>")
            n = int(tokens_in[step])
            text.append(f'<span class="step{" odd" if step % 2 else ""}" data-step="{step}" data-tokens="{n}" '
                        f'title="forward pass {step + 1}: {n} token{"s" if n != 1 else ""}">')
            open_step = step
        name = SOURCES[source]
        text.append(esc(piece) if source == MODEL else f'<span class="src-{name}" data-source="{name}">{esc(piece)}</span>')
    if open_step is not None:
        text.append("</span>")

    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{esc(title)}</title>",
        "<style>", *css, "</style></head><body>",
        f"<h1>{esc(title)}</h1>", f'<p class="summary">{esc(str(stats))}</p>',
        f'<p class="legend">{"<br>".join(keys)}</p>',
        "<h2>Tokens per forward pass, along the text</h2>", f'<div class="bars">{"".join(bars)}</div>',
        "<h2>The text written</h2>", f'<div class="text">{"".join(text)}</div>',
        "</body></html>", "",
    ])


def render(stats, tokenizer, *, html=None, file=None, color: bool | None = None) -> str:
    """Prints the written text with kept drafts marked by source, then the stats and a legend; writes the HTML page
    to `html` if given. Returns what it printed (DraftStats.render documents the arguments)."""
    file = sys.stdout if file is None else file
    if color is None:
        color = bool(file) and hasattr(file, "isatty") and file.isatty()
    runs = segments(stats, tokenizer)
    printed = f"{terminal_text(runs, color=color)}\n\n{stats}\n{legend(stats, color=color)}\n"
    if file:
        file.write(printed)
    if html is not None:
        Path(html).write_text(page(stats, runs), encoding="utf-8")
    return printed
