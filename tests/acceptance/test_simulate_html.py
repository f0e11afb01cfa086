"""`gov simulate --html` (300 users x 7 days, the issue's page): rendered by headless
Chromium, it says only what the run knows (issue 31, item 2). It leads with the marginal
measure beside the noiseless truth; the seeds' volume buckets carry a crossover only when
the measure confirms it; the realised outcomes are counts with no verdict, never "truth"."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from gov.analytics.report import CTR_COLOR
from tests.acceptance.test_report_html import CHROMIUM, chromium, near, png_pixels
from tests.acceptance.test_simulate import gov_simulate


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium); CI installs it")
def test_the_page_says_only_what_the_run_knows(pg_server: str, tmp_path: Path) -> None:
    page = tmp_path / "sim.html"
    run = gov_simulate("--users", "300", "--days", "7", "--seed", "1", "--html", str(page), "--database-url", pg_server)
    assert run.returncode == 0, run.stderr

    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    lead = re.search(r'<p class="verdict lead">Fatigue, all users: the marginal measure says (.+?); '
                     r"the truth \(no noise\) says ([^<]+?) [✓–✗]", html)
    assert lead is not None, html
    measure = lead.group(1)
    # in this order: the measure and the truth, the seeds' view, what the dice gave
    assert lead.start() < html.index("The seeds' view") < html.index("What the dice gave (realised, not the truth)")
    assert "Ground truth" not in html and "Crossover from" not in html  # the old verdict off six sends
    seeds = html[html.index("The seeds' view") : html.index("What the dice gave")]
    if not measure.startswith("crossover"):  # nothing for the buckets to confirm: no mark, no verdict
        assert 'class="crossover"' not in seeds
        assert "no verdict from the buckets" in seeds
    dice = html[html.index("What the dice gave") :]
    assert re.search(r"<td>\d[\d,]* \(\d+\.\d\d%\)</td>", dice)  # counts, with their rates
    assert "no verdict from them" in dice

    shot = tmp_path / "sim.png"
    rendered = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,6000", page.as_uri())
    assert rendered.returncode == 0 and shot.exists(), rendered.stderr
    _, _, pixels = png_pixels(shot.read_bytes())
    colors = Counter(pixels)
    assert near(colors, CTR_COLOR) > 200, "no click-through line on screen"  # the page is drawn, charts and all
