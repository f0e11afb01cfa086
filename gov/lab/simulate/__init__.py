"""``gov simulate``: the seeds' story played against gov on a simulation clock.

Four teams (lifecycle, merchandising, product, orders) send to one population through
:meth:`gov.Governor.send`; the releaser and the runner run on the same clock and every
allowed message reaches the loopback push service of :mod:`gov.testing`; simulated users
display, click, close and unsubscribe as the week's volume grows, so the fatigue report
has something real to find. ``--compare`` replays the same story with every cap out of
reach (the same planned messages; those to users who unsubscribed are not sent). See
:mod:`gov.lab.simulate.story` (who sends what, when, and how users react),
:mod:`gov.lab.simulate.engine` (the clocked loop) and :mod:`gov.lab.simulate.summary`.
"""

from __future__ import annotations

from gov.lab.simulate.engine import EngineStats, RunOutcome, SimConfig, SimulationError, simulate, ungoverned
from gov.lab.simulate.summary import Summary

__all__ = ["EngineStats", "RunOutcome", "SimConfig", "SimulationError", "Summary", "simulate", "ungoverned"]
