"""`gov report fatigue --html`: the page a person opens, rendered by headless Chromium."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gov import Governor
from gov.analytics.report import CROSSOVER_COLOR, CTR_COLOR, UNSUBSCRIBE_COLOR
from gov.testing import PushService
from tests.integration.test_report import seed_fatigue

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--hide-scrollbars", *args],
        capture_output=True, text=True, timeout=120,
    )


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Decode an 8-bit RGB or RGBA PNG (what Chromium writes) into (width, height, RGB pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    previous, pixels = bytearray(stride), []
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, up_left = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 0xFF
        pixels.extend(tuple(line[i : i + 3]) for i in range(0, stride, bpp))  # type: ignore[misc]
        previous = line
    return width, height, pixels  # type: ignore[return-value]


def near(colors: Counter[tuple[int, int, int]], color: str, tolerance: int = 24) -> int:
    """How many pixels are within ``tolerance`` of ``color`` (#rrggbb) on every channel."""
    target = tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))
    return sum(n for p, n in colors.items() if all(abs(a - b) <= tolerance for a, b in zip(p, target, strict=True)))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium); CI installs it")
def test_the_page_shows_both_series_and_the_crossover(db_url: str, tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    with PushService() as push, Governor(db_url, allow_loopback_http=True, pool_size=2) as gov:
        seed_fatigue(gov, push, now)
    page = tmp_path / "fatigue.html"
    result = subprocess.run(
        [sys.executable, "-m", "gov.cli", "report", "fatigue", "--by", "volume", "--since", "7d",
         "--at", now.isoformat(), "--html", str(page)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "GOV_DATABASE_URL": db_url},
    )
    assert result.returncode == 0, result.stderr
    assert "crossover" in result.stdout

    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    assert dom.stdout.count('data-series="ctr"') == 1
    assert dom.stdout.count('data-series="unsubscribe_rate"') == 1
    assert dom.stdout.count("<circle") == 8  # four buckets on each chart
    assert dom.stdout.count('class="crossover" data-bucket="3"') == 2
    assert "Crossover at bucket 3" in dom.stdout

    shot = tmp_path / "fatigue.png"
    rendered = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri())
    assert rendered.returncode == 0 and shot.exists(), rendered.stderr
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 900)
    colors = Counter(pixels)
    inked = sum(n for p, n in colors.items() if min(p) < 235)
    assert inked > 0.02 * len(pixels), f"the page is nearly blank: {inked} inked pixels"
    # both series and the crossover marker are drawn, each in its own colour
    assert near(colors, CTR_COLOR) > 200, "no CTR line on screen"
    assert near(colors, UNSUBSCRIBE_COLOR) > 200, "no unsubscribe-rate line on screen"
    assert near(colors, CROSSOVER_COLOR) > 100, "no crossover marker on screen"
