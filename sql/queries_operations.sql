-- Named statements for running gov: health checks and liveness, /metrics, pruning,
-- and the conservation check.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: health
SELECT check_name, ok, detail FROM gov.health_v1(%(now)s, %(stuck_after)s);

-- name: ping
SELECT 1;

-- name: metrics
-- Everything /metrics reads from the database, in one call (gov.metrics_v1).
SELECT metric, labels, value FROM gov.metrics_v1(%(window_ms)s);

-- name: prune_sends
SELECT gov.prune_sends_v1(%(batch)s, %(margin)s, %(now)s);

-- name: prune_history
SELECT gov.prune_history_v1(%(batch)s, %(keep)s, %(now)s);

-- name: message_states
SELECT state, count(*) FROM gov.message_states_v1(%(since)s, %(until)s) GROUP BY state ORDER BY state;

-- name: inconsistent_messages
SELECT user_id, message_id, tier, state FROM gov.message_states_v1(%(since)s, %(until)s)
 WHERE state LIKE 'INCONSISTENT%%' ORDER BY user_id, message_id LIMIT %(limit)s;

-- The integrity checks (gov.ops.integrity): an independent scan of what the decision
-- wrote, for soak runs, fault tests and operators who want proof after an incident.

-- name: integrity_cap_windows
SELECT window_ms FROM gov.caps
 UNION SELECT window_ms FROM gov.segment_caps
 UNION SELECT window_ms FROM gov.user_caps
 ORDER BY 1;

-- name: integrity_over_cap
-- For one window length: every (user, budget) whose send rows, in some window of that
-- length ending at one of its rows, outnumber the cap that applies. A decision counts the
-- rows newer than ``now - window`` (whatever their order of commit) before it adds its
-- own, so this holds for every row however decisions interleave; the frame is
-- ``window - 1 µs`` because the window is open at its old end. The caps are restated
-- here on purpose, as an independent reading of the policy: a tier's windows are the
-- user's segment's when the policy gives that segment windows for the tier, else the
-- tier's own; topic budgets take the topic's own caps, else those of "*"; a user's own
-- cap lowers any of them and holds on its own. Segments are read as they are now: a
-- user who changed segment during the checked span may be judged by the new one.
WITH counted AS (
    SELECT s.user_id, s.budget,
           count(*) OVER (PARTITION BY s.user_id, s.budget ORDER BY s.sent_at
                          RANGE BETWEEN %(frame)s::interval PRECEDING AND CURRENT ROW) AS n
      FROM gov.sends s
), peaks AS (
    SELECT c.user_id, c.budget, max(c.n) AS n, u.segment
      FROM counted c LEFT JOIN gov.users u ON u.user_id = c.user_id
     GROUP BY c.user_id, c.budget, u.segment
), rules AS (
    SELECT p.user_id, p.budget, c.cap
      FROM peaks p
      JOIN gov.caps c ON c.window_ms = %(window_ms)s AND c.topic = '' AND c.scope = p.budget
     WHERE NOT EXISTS (SELECT 1 FROM gov.segment_caps sc WHERE sc.tier = c.scope AND sc.segment = p.segment)
    UNION ALL
    SELECT p.user_id, p.budget, sc.cap
      FROM peaks p
      JOIN gov.segment_caps sc ON sc.window_ms = %(window_ms)s AND sc.tier = p.budget AND sc.segment = p.segment
    UNION ALL
    SELECT p.user_id, p.budget, c.cap
      FROM peaks p
      JOIN gov.caps c
        ON c.window_ms = %(window_ms)s AND c.scope = 'topic'
       AND (p.budget = 'topic:' || c.topic
            OR (c.topic = '*' AND left(p.budget, 6) = 'topic:'
                AND NOT EXISTS (SELECT 1 FROM gov.caps o WHERE o.scope = 'topic' AND p.budget = 'topic:' || o.topic)))
    UNION ALL
    SELECT p.user_id, p.budget, uc.cap
      FROM peaks p
      JOIN gov.user_caps uc ON uc.window_ms = %(window_ms)s AND uc.user_id = p.user_id AND uc.scope = p.budget
), applied AS (
    SELECT user_id, budget, min(cap) AS cap FROM rules GROUP BY user_id, budget
)
SELECT p.user_id, p.budget, %(window_ms)s::bigint AS window_ms, p.n, a.cap
  FROM peaks p
  JOIN applied a ON a.user_id = p.user_id AND a.budget = p.budget
 WHERE p.n > a.cap
 ORDER BY p.user_id, p.budget;

-- name: budget_map
SELECT gov.budget_map_v1();

-- name: integrity_spend_mismatches
-- Messages whose spend is not exactly one row in each budget the decision writes (those of
-- the tier's cascade, the topic and global that a cap reads: gov.budgets_of over
-- %(budget_map)s, gov.budget_map_v1() read first), or whose
-- spend has no decision at all: a partial decision, a double spend, or a spend that no
-- verdict accounts for. Read against the policy in force: a message decided before a
-- policy capped or uncapped one of its budgets is reported too.
WITH spent AS (
    SELECT s.user_id, s.message_id, count(*) AS n, count(DISTINCT s.budget) AS budgets
      FROM gov.sends s GROUP BY s.user_id, s.message_id
), expected AS (
    SELECT m.user_id, m.message_id, m.tier,
           CASE WHEN NOT m.allowed OR t.exempt THEN 0
                ELSE cardinality(gov.budgets_of(%(budget_map)s, m.tier, m.topic))
           END AS n
      FROM gov.messages m JOIN gov.tiers t ON t.tier = m.tier
)
SELECT coalesce(e.user_id, s.user_id), coalesce(e.message_id, s.message_id), e.tier,
       coalesce(e.n, -1) AS expected, coalesce(s.n, 0) AS spent
  FROM expected e
  FULL JOIN spent s ON s.user_id = e.user_id AND s.message_id = e.message_id
 WHERE e.user_id IS NULL OR coalesce(s.n, 0) <> e.n OR coalesce(s.budgets, 0) <> coalesce(s.n, 0)
 ORDER BY 1, 2
 LIMIT %(limit)s;
