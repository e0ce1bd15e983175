"""The view of where the drafts came from: the terminal text, the HTML page in a real headless browser, `lookahead show`."""

import io
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import transformers

import lookahead
from lookahead import LookupDrafter
from lookahead.bench.cli import main
from lookahead.draft import SOURCES
from lookahead.view import STYLE, segments
from tests.models import STORIES, stories_model

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play with her toys. "
         "Once upon a time, there was a little girl named Lily. She")
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def story():
    """(stats of a second call, which copies from the prompt, its output and memory; the text it wrote; tokenizer)."""
    model = stories_model()
    tokenizer = transformers.AutoTokenizer.from_pretrained(STORIES)
    prompt = tokenizer(STORY, return_tensors="pt").input_ids
    drafter = LookupDrafter(cost_aware=False)  # (sized, what pays depends on the machine's load)
    lookahead.generate(model, prompt, drafter=drafter, max_new_tokens=40)
    out = lookahead.generate(model, prompt, drafter=drafter, max_new_tokens=80)
    return drafter.stats, tokenizer.decode(out[0, prompt.shape[1]:]), tokenizer


def test_the_terminal_view_marks_kept_drafts_by_source_and_its_text_is_the_output(story):
    stats, written, tokenizer = story
    assert "".join(text for text, _, _ in segments(stats, tokenizer)) == written
    coloured = stats.render(tokenizer, file=io.StringIO(), color=True)
    assert ANSI.sub("", coloured).startswith(written + "\n\n" + str(stats) + "\n")
    for name, (_, kept) in stats.by_source.items():  # each source that had tokens kept, in its colour
        assert (f"\x1b[48;5;{STYLE[name][1]}m" in coloured) == (kept > 0)
    plain = io.StringIO()
    printed = stats.render(tokenizer, file=plain)  # not a terminal: markers, no colour
    assert plain.getvalue() == printed and "\x1b[" not in printed
    assert "[p|" in printed and "[m|" in printed  # the prompt's and the first call's (memory's) spans
    assert re.sub(r"\[[a-z?]\|(.*?)\]", r"\1", printed.split("\n\n")[0], flags=re.S) == written


def read_png(path: Path) -> np.ndarray:
    """(height, width, channels) uint8 of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, color_type, _, _, interlace = header
    assert depth == 8 and color_type in (2, 6) and interlace == 0, header
    channels = 3 if color_type == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), dtype=np.uint8).reshape(height, 1 + width * channels)
    stride = width * channels
    out = np.zeros((height, stride), dtype=np.int32)
    for y in range(height):  # undo each row's filter (PNG spec, 9.2)
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        up = out[y - 1] if y else np.zeros(stride, dtype=np.int32)
        if kind == 0:
            row = line
        elif kind == 2:
            row = (line + up) & 255
        else:  # Sub, Average, Paeth: each byte depends on the one `channels` before it
            row = np.zeros(stride, dtype=np.int32)
            for x in range(stride):
                left = row[x - channels] if x >= channels else 0
                corner = up[x - channels] if x >= channels else 0
                if kind == 1:
                    predicted = left
                elif kind == 3:
                    predicted = (left + up[x]) // 2
                else:
                    p = left + up[x] - corner
                    pa, pb, pc = abs(p - left), abs(p - up[x]), abs(p - corner)
                    predicted = left if pa <= pb and pa <= pc else up[x] if pb <= pc else corner
                row[x] = (line[x] + predicted) & 255
        out[y] = row
    return out.astype(np.uint8).reshape(height, width, channels)


def chromium(*args: str) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp()
    command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(BROWSER is None, reason="no chromium installed (.ci/run installs Debian's)")
def test_the_html_view_renders_in_a_headless_browser_with_its_sources_coloured(story, tmp_path):
    stats, written, tokenizer = story
    page = tmp_path / "drafts.html"
    stats.render(tokenizer, html=page, file=False)
    dom = chromium("--dump-dom", page.as_uri()).stdout
    kept = [name for name, (_, k) in stats.by_source.items() if k]
    for name in kept:
        assert f'data-source="{name}"' in dom
    assert dom.count('class="step') == stats.steps and dom.count('class="bar"') == stats.steps  # a step's underline and bar each
    assert 'title="forward pass 1:' in dom and str(stats).split(";")[0] in dom
    shot = tmp_path / "drafts.png"
    chromium(f"--screenshot={shot}", "--window-size=1000,800", "--hide-scrollbars", page.as_uri())
    pixels = read_png(shot)[..., :3].reshape(-1, 3)
    colours = {tuple(c) for c in np.unique(pixels, axis=0).tolist()}
    assert len(colours) > 2  # not blank
    for name in kept:  # each kept source's background is on screen, exactly its colour
        hex_colour = STYLE[name][0]
        assert tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)) in colours, name
    assert set(SOURCES) == set(STYLE)


def test_lookahead_show_runs_a_model_on_a_prompt_and_writes_the_page(tmp_path, capsys):
    stories_model()  # (skips where the model is absent)
    page = tmp_path / "show.html"
    assert main(["show", str(STORIES), "--prompt", STORY, "--max-new-tokens", "24", "--runs", "2", "--html", str(page),
                 "--color", "never"]) == 0
    printed = capsys.readouterr().out
    assert "tokens in" in printed and "[m|" in printed and f"wrote {page}" in printed
    assert 'data-source="memory"' in page.read_text(encoding="utf-8")
