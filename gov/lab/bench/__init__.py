"""``gov bench``: decisions per second, gov against the seeds' Redis scripts and a floor.

* :mod:`gov.lab.bench.decisions`: the scratch database, the workloads, the client processes
  and the timed runs.
* :mod:`gov.lab.bench.redis_lua`: the seeds' two Lua scripts and the send paths that call them.
* :mod:`gov.lab.bench.report`: the figures, as a rich table and as JSON.
* :mod:`gov.lab.bench.cli`: the ``bench`` click command.

Every figure is relative: compare contenders measured in one run (the ``× floor``
column), never absolute numbers across runs or machines (PERFORMANCE.md: ±20% noise).
"""

from __future__ import annotations

from gov.lab.bench.decisions import CONTENDERS, WORKLOADS, BenchConfig, BenchError, run
from gov.lab.bench.report import Figures, Report

__all__ = ["CONTENDERS", "WORKLOADS", "BenchConfig", "BenchError", "Figures", "Report", "run"]
