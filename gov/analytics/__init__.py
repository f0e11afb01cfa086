"""What happened and what would have: ``events`` (display, click, close, unsubscribe
beacons), ``report`` (the fatigue report, revocation suspects), ``whatif`` (replaying
recorded decisions under another policy) and ``tables`` (the analysts' tables and views
as SQLAlchemy Core)."""
