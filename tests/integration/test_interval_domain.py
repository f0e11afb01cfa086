"""The analysts' interval functions answer NULL outside their domain (no sends, counts that
are no proportion's, a negative z) instead of dividing by zero, failing on a negative
root or returning an interval whose low end is above its high end; inside it they are
the Python measure's (gov.analytics.marginal)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from gov.analytics.marginal import difference_low, wilson

Z = 1.959963984540054


@pytest.mark.parametrize(("k", "n", "z"), [(1, 0, Z), (-1, 3, Z), (5, 3, Z), (1, 3, -1.0)])
def test_a_wilson_interval_outside_its_domain_is_null(conn: psycopg.Connection[Any], k: float, n: float,
                                                      z: float) -> None:
    assert conn.execute("SELECT * FROM gov.wilson_interval_v1(%s, %s, %s)", (k, n, z)).fetchone() == (None, None)


@pytest.mark.parametrize(("u", "c", "n"), [(1, 1, 0), (5, 1, 3), (-1, 0, 3)])
def test_a_difference_outside_its_domain_is_null(conn: psycopg.Connection[Any], u: float, c: float,
                                                 n: float) -> None:
    assert conn.execute("SELECT gov.difference_low_v1(%s, %s, %s, %s)", (u, c, n, Z)).fetchone() == (None,)


def test_inside_the_domain_the_intervals_are_the_python_measure_s(conn: psycopg.Connection[Any]) -> None:
    for k, n in ((0, 10), (5, 10), (10, 10), (3, 100)):
        low, high = conn.execute("SELECT * FROM gov.wilson_interval_v1(%s, %s)", (k, n)).fetchone() or (None, None)
        assert (low, high) == pytest.approx(wilson(k, n))
    got = conn.execute("SELECT gov.difference_low_v1(12, 9, 300, %s)", (Z,)).fetchone()
    assert got is not None and got[0] == pytest.approx(difference_low(12, 9, 300, Z))
