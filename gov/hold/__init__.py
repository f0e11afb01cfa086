"""Held messages: deferred, quiet-hours and collapse groups wait in gov.deferred until
``release`` (the :class:`~gov.hold.release.Releaser`, run by `gov release`) lets them go.
Holding itself happens inside the decision, in SQL (``sql/schema``)."""
