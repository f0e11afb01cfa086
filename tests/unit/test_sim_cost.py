"""The cost line of `gov simulate`: CPU-seconds by who spent them, and what it says when the server is not countable."""

from __future__ import annotations

from gov.lab.simulate.cost import RunCost


def test_the_cost_line_names_each_part_and_the_whole() -> None:
    line = RunCost(own_s=16.3, children_s=38.0, server_s=46.0, server_note="", cores=2, load_before=0.25).line()
    assert line == ("CPU 100.3 s on 2 cores, load 0.25 before: gov 54.3 (this process 16.3, runners and push "
                    "services 38.0), PostgreSQL 46.0")


def test_a_server_that_cannot_be_counted_is_said_so_not_counted_as_nothing() -> None:
    cost = RunCost(own_s=1.0, children_s=2.0, server_s=None, server_note="not local", cores=4, load_before=1.0)
    assert cost.total_s is None
    assert cost.line() == ("CPU 3.0 s without the server on 4 cores, load 1.00 before: gov 3.0 (this process 1.0, "
                           "runners and push services 2.0), PostgreSQL not counted: not local")
