"""`gov report fatigue --html` (by position): the page a person opens, rendered by headless Chromium."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from gov.analytics.marginal import CLICK_COLOR, CROSSOVER_COLOR, UNSUBSCRIBE_COLOR
from tests.acceptance.test_report_html import CHROMIUM, chromium, near, png_pixels
from tests.integration.test_fatigue_marginal import END, _population


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium); CI installs it")
def test_the_page_shows_both_curves_their_bands_and_the_crossover(db_url: str, tmp_path: Path) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        _population(conn)
    page = tmp_path / "marginal.html"
    result = subprocess.run(
        [sys.executable, "-m", "gov.cli", "report", "fatigue", "--since", "30d", "--min-events", "20",
         "--at", END.isoformat(), "--html", str(page)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "GOV_DATABASE_URL": db_url},
    )
    assert result.returncode == 0, result.stderr
    assert "crossover at or before position 7" in result.stdout

    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    sections = dom.stdout.count('<section class="segment"')
    assert sections == 3  # everyone, users without a segment, segment "even"
    assert dom.stdout.count('data-series="click"') == sections
    assert dom.stdout.count('data-series="unsubscribe"') == sections
    assert dom.stdout.count('data-band="click"') == sections and dom.stdout.count('data-band="unsubscribe"') == sections
    assert '<g class="crossover" data-position="7">' in dom.stdout
    assert "crossover at or before position 7" in dom.stdout

    shot = tmp_path / "marginal.png"
    rendered = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,800", page.as_uri())
    assert rendered.returncode == 0 and shot.exists(), rendered.stderr
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 800)
    colors = Counter(pixels)
    inked = sum(n for p, n in colors.items() if min(p) < 235)
    assert inked > 0.02 * len(pixels), f"the page is nearly blank: {inked} inked pixels"
    assert near(colors, CLICK_COLOR) > 200, "no click-rate curve on screen"
    assert near(colors, UNSUBSCRIBE_COLOR) > 200, "no unsubscribe-rate curve on screen"
    assert near(colors, CROSSOVER_COLOR) > 100, "no crossover marker on screen"
