-- Named statements of `gov simulate` (gov/lab/simulate/). Read-only on gov's tables: the
-- simulation changes gov's state only through the public API (Governor.send and the SQL
-- functions behind it, the releaser, the runner, record_event).

-- name: sim_send_series
-- A lane's messages that are each alone at their instant, in their order, in one statement:
-- gov.send_v1 for each at its own moment, as Governor.send would call it one round trip at
-- a time. Each call is the whole decision (the user's lock, the rules, the hold, the
-- fan-out) and sees the calls before it (a volatile function's statements take a new
-- snapshot); the rows come in the document's order. Message k is [user_id, message_id,
-- tier, topic, campaign_id, content, collapse_key, ttl, at] (gov.governor.send_row + at).
SELECT s.action, s.outbox_ids
  FROM jsonb_array_elements(%(batch)s::jsonb) WITH ORDINALITY AS m(v, n)
 CROSS JOIN LATERAL gov.send_v1(m.v->>0, m.v->>1, m.v->>2, m.v->>3, m.v->>4, m.v->5, m.v->>6,
                                (m.v->>7)::integer, (m.v->>8)::timestamptz) s
 ORDER BY m.n;

-- name: sim_outbox_outcomes
-- What became of outbox rows the runners did not report (not claimed: not due yet, or
-- ended meanwhile), one row per (message, endpoint); the caller orders them with the rest.
-- Rows by the outbox's key, (user id, id): by id alone the key index is read whole.
SELECT o.id, o.user_id, o.message_id, o.subscription_id, o.state
  FROM unnest(%(users)b::text[], %(ids)b::bigint[]) AS k(user_id, id)
  JOIN gov.outbox o ON o.user_id = k.user_id AND o.id = k.id;

-- name: sim_dispositions
-- Every message the teams handed to gov, by tier and topic, by what finally became of it.
-- sent: allowed at once; released: held (deferred or quiet hours) then sent; collapsed:
-- folded into a summary (summaries: how many went out); dropped: refused, or held and
-- refused again at release; expired: its TTL or defer_max ran out while held; held: still
-- waiting when the simulation ended; delivered: accepted by the push service on at least
-- one endpoint.
-- (Each message's facts are gathered per row first, the counts after: on a Citus cluster
-- a subquery is pushed down to the shards only before the aggregate.)
SELECT x.tier,
       x.topic,
       count(*) AS messages,
       count(*) FILTER (WHERE x.d_id IS NULL AND x.allowed) AS sent,
       count(*) FILTER (WHERE x.state = 'released') AS released,
       count(*) FILTER (WHERE x.state = 'collapsed') AS collapsed,
       count(*) FILTER (WHERE x.outcome = 'summary') AS summaries,
       count(*) FILTER (WHERE (x.d_id IS NULL AND NOT x.allowed) OR x.state = 'dropped') AS dropped,
       count(*) FILTER (WHERE x.state = 'expired') AS expired,
       count(*) FILTER (WHERE x.state = 'waiting') AS held,
       count(*) FILTER (WHERE x.delivered) AS delivered
  FROM (SELECT m.tier, coalesce(m.topic, '') AS topic, m.allowed, d.id AS d_id, d.state, d.outcome,
               EXISTS (SELECT 1 FROM gov.outbox o
                        WHERE o.user_id = m.user_id AND o.message_id = m.message_id
                          AND o.state = 'delivered') AS delivered
          FROM gov.messages m
          LEFT JOIN gov.deferred d ON d.user_id = m.user_id AND d.message_id = m.message_id) x
 GROUP BY x.tier, x.topic
 ORDER BY x.tier, x.topic;

-- name: sim_exempt_delivery
-- The exempt tier (P0): how many messages, how many allowed, how many delivered to every
-- endpoint they fanned out to, how many had no endpoint at all, and suppressions (must be 0).
WITH exempt AS (
    SELECT count(*) AS messages,
           count(*) FILTER (WHERE x.allowed) AS allowed,
           count(*) FILTER (WHERE x.fanned_out AND NOT x.undelivered) AS all_delivered,
           count(*) FILTER (WHERE NOT x.fanned_out) AS no_endpoint
      FROM (SELECT m.allowed,
                   EXISTS (SELECT 1 FROM gov.outbox o
                            WHERE o.user_id = m.user_id AND o.message_id = m.message_id) AS fanned_out,
                   EXISTS (SELECT 1 FROM gov.outbox o
                            WHERE o.user_id = m.user_id AND o.message_id = m.message_id
                              AND o.state <> 'delivered') AS undelivered
              FROM gov.messages m
             WHERE m.tier IN (SELECT t.tier FROM gov.tiers t WHERE t.exempt)) x
), suppressed AS (
    SELECT count(*) AS suppressed
      FROM gov.push_suppressions s
     WHERE s.tier IN (SELECT t.tier FROM gov.tiers t WHERE t.exempt)
)
SELECT e.messages, e.allowed, e.all_delivered, e.no_endpoint, s.suppressed FROM exempt e CROSS JOIN suppressed s;

-- name: sim_blocking_rules
-- The rules that blocked most, with the verb applied. A message the hold refused at its
-- decision because its wait would pass defer_max or its TTL is logged as a drop, but its
-- held row is expired (defer_expired, ttl_expired), and the per-tier table counts it as
-- expired: its action reads 'drop: defer_expired' (or ttl_expired), so no count here
-- seems to contradict that table. (A suppression is logged at a message's first decision.)
SELECT x.blocked_by, x.tier, x.action, count(*) AS n
  FROM (SELECT s.blocked_by, s.tier,
               CASE WHEN s.action = 'drop' AND d.state = 'expired' THEN s.action || ': ' || d.outcome
                    ELSE s.action END AS action
          FROM gov.push_suppressions s
          LEFT JOIN gov.deferred d ON d.user_id = s.user_id AND d.message_id = s.message_id) x
 GROUP BY x.blocked_by, x.tier, x.action
 ORDER BY n DESC, x.blocked_by, x.tier, x.action
 LIMIT %(limit)s;

-- name: sim_expired_outcomes
-- The held messages that expired, per tier and outcome: defer_expired (the wait for a slot
-- would pass the tier's defer_max) or ttl_expired (it would pass the message's TTL), and
-- of them, how many expired at their decision (never waited: held and expired at once).
SELECT d.tier, d.outcome, count(*) AS expired, count(*) FILTER (WHERE d.finished_at = d.enqueued_at) AS at_decision
  FROM gov.deferred d
 WHERE d.state = 'expired'
 GROUP BY d.tier, d.outcome
 ORDER BY d.tier, d.outcome;

-- name: sim_sends_per_user
-- Messages the push service accepted for each subscriber over the whole run (one message
-- on two browsers is one send), zero for those who received nothing; ascending.
SELECT coalesce(n.sends, 0) AS sends
  FROM (SELECT DISTINCT s.user_id FROM gov.subscriptions s) u
  LEFT JOIN (SELECT o.user_id, count(DISTINCT o.message_id) AS sends
               FROM gov.outbox o WHERE o.state = 'delivered' GROUP BY o.user_id) n
         ON n.user_id = u.user_id
 ORDER BY 1;

-- name: sim_daily_sends
-- Messages accepted per simulated day (UTC) and tier.
SELECT (date_trunc('day', o.finished_at AT TIME ZONE 'UTC'))::date AS day, m.tier,
       count(DISTINCT (o.user_id, o.message_id)) AS n
  FROM gov.outbox o
  JOIN gov.messages m ON m.user_id = o.user_id AND m.message_id = o.message_id
 WHERE o.state = 'delivered'
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: sim_delivery_totals
-- Requests sent to the push service, by how they ended.
SELECT a.outcome, count(*) FROM gov.delivery_attempts a GROUP BY a.outcome ORDER BY a.outcome;

-- name: sim_event_totals
-- Telemetry by event kind: messages that drew the event, and distinct users.
SELECT e.event, count(DISTINCT (e.user_id, e.message_id)) AS messages, count(DISTINCT e.user_id) AS users
  FROM gov.push_events e
 GROUP BY e.event
 ORDER BY e.event;

-- name: sim_clicks_non_p0
-- Non-P0 messages that drew a click (a summary counts as its carrier's message).
SELECT count(DISTINCT (e.user_id, e.message_id))
  FROM gov.push_events e
  JOIN gov.messages m ON m.user_id = e.user_id AND m.message_id = e.message_id
 WHERE e.event = 'click' AND m.tier <> 'P0';

-- name: sim_delivered_non_p0
-- Every delivered non-P0 message (accepted by the push service on at least one endpoint),
-- whether the timing moved it and whether it drew a click (a summary counts as its
-- carrier's message, as sim_clicks_non_p0). moved: 'best' or 'explore' when the hold was
-- released at an hour gov.best_slot chose after its first slot (gov.deferred.first_at
-- kept), NULL when it went at its first slot or was never held. `gov simulate --policy F
-- --compare` pairs these by message with the baseline's run (common random numbers).
SELECT m.user_id, m.message_id,
       CASE WHEN d.first_at IS NOT NULL AND d.state = 'released' THEN d.timing END AS moved,
       EXISTS (SELECT 1 FROM gov.push_events e
                WHERE e.user_id = m.user_id AND e.message_id = m.message_id AND e.event = 'click') AS clicked
  FROM gov.messages m
  LEFT JOIN gov.deferred d ON d.user_id = m.user_id AND d.message_id = m.message_id
 WHERE m.tier <> 'P0'
   AND EXISTS (SELECT 1 FROM gov.outbox o
                WHERE o.user_id = m.user_id AND o.message_id = m.message_id AND o.state = 'delivered')
 ORDER BY m.user_id, m.message_id;

-- name: sim_next_release
-- When the releaser next has something to do (NULL: nothing waits).
SELECT min(d.release_at) FROM gov.deferred d WHERE d.state = 'waiting';

-- name: sim_collapse_split
-- Every message of a collapse tier, by what finally became of it: delivered on its own
-- (at once, or released alone), stood for by a summary that was delivered (the summary
-- itself counted), still held at the end (a group's carrier, or collapsed into one that
-- still waits), expired, or anything else (dropped, failed, no endpoint, not delivered);
-- and of those held, how many are folded into a waiting carrier (the per-tier table's
-- "held at end" counts the waiting rows alone).
WITH c AS (
    SELECT m.tier, d.state, d.outcome, d.collapsed_into, m.allowed, d.id IS NULL AS never_held,
           EXISTS (SELECT 1 FROM gov.outbox o
                    WHERE o.user_id = m.user_id AND o.message_id = m.message_id AND o.state = 'delivered')
               AS delivered,
           (SELECT s.state FROM gov.deferred s
             WHERE s.user_id = d.user_id AND s.message_id = d.collapsed_into) AS carrier_state,
           EXISTS (SELECT 1 FROM gov.outbox o
                    WHERE o.user_id = d.user_id AND o.message_id = d.collapsed_into AND o.state = 'delivered')
               AS summary_delivered
      FROM gov.messages m
      JOIN gov.tiers t ON t.tier = m.tier AND t.on_exceed = 'collapse'
      LEFT JOIN gov.deferred d ON d.user_id = m.user_id AND d.message_id = m.message_id
)
SELECT tier,
       count(*) AS messages,
       count(*) FILTER (WHERE (never_held AND allowed OR state = 'released') AND delivered) AS alone,
       count(*) FILTER (WHERE state = 'collapsed' AND summary_delivered) AS summarised,
       count(*) FILTER (WHERE state = 'waiting' OR (state = 'collapsed' AND carrier_state = 'waiting')) AS held,
       count(*) FILTER (WHERE state = 'expired') AS expired,
       count(*) FILTER (WHERE state = 'collapsed' AND carrier_state = 'waiting') AS held_folded
  FROM c
 GROUP BY tier
 ORDER BY tier;

-- name: sim_collapse_expired_by_key
-- The expired messages of collapse tiers by collapse key, most first: which senders'
-- deadlines could not outlive the wait for a slot.
SELECT m.tier, coalesce(c.collapse_key, '(no key)') AS key, count(*) AS expired
  FROM gov.messages m
  JOIN gov.tiers t ON t.tier = m.tier AND t.on_exceed = 'collapse'
  JOIN gov.deferred d ON d.user_id = m.user_id AND d.message_id = m.message_id AND d.state = 'expired'
  LEFT JOIN gov.message_content c ON c.user_id = m.user_id AND c.message_id = m.message_id
 GROUP BY 1, 2
 ORDER BY 3 DESC, 2;

-- name: sim_record_events
-- One tick's engagement events in one statement: gov.record_event_v1 for each, as
-- gov.analytics.events.record_event calls it one at a time (each event is its own row,
-- no order between them matters); one round trip and one commit instead of one per event.
-- Each at its own moment: with the hour effect a notification may show later than delivered.
SELECT count(*)
  FROM unnest(%(user_ids)b::text[], %(message_ids)b::text[], %(events)b::text[], %(subscription_ids)b::bigint[],
              %(ats)b::timestamptz[]) AS x(u, m, e, s, t)
 CROSS JOIN LATERAL gov.record_event_v1(x.u, x.m, x.e, x.s, x.t) AS r;

-- name: sim_new_outbox
-- Outbox rows queued since the last tick that no call returned: held rows a send released
-- first because a slot they were owed opened (gov.release_owed), so the runner delivers
-- them this tick as any other. Only this run's rows, all committed when it is read.
SELECT o.user_id, o.id FROM gov.outbox o
 WHERE o.state IN ('pending', 'sending') AND o.next_attempt_at <= %(now)s AND o.id > %(after)s
 ORDER BY o.id;

-- name: sim_expired_split
-- The messages that expired on their TTL (ttl_expired), per tier, split in two: "a slot
-- went to a later deadline" when, between the message's hold (enqueued_at) and its
-- deadline (its group's: the expiry of the carrier it was collapsed into, else its own),
-- the same user was sent (a gov.sends row) a message of another group whose own deadline
-- was later, in the held message's own budget (its tier's, or its topic's), at a moment
-- the held message would have passed every one of its rules had that send not been made
-- (its windows counted without it); else "no slot opened before its TTL". The first is
-- what earliest deadline first makes 0. A send in a budget that was not the one full (a
-- P1 slot, while the held message waited for its topic's weekly cap) took nothing from
-- it; the global budget is not a slot of the held message's own (a fresh message of a
-- higher tier goes before it there, by tier, not by deadline). The rules are
-- those gov.decide_core reads for the message (its tier, its topic's caps or "*", the
-- user's segment's windows when the policy has them, with the user's segment at the end
-- of the run); a user's own caps are not read (the simulation sets none).
-- (Joins and GROUP BY, no correlated subquery: a Citus cluster plans none over CTEs.)
WITH e AS (
    SELECT d.user_id, d.id AS hold_id, d.tier, m.topic, d.enqueued_at,
           coalesce(gc.expires_at, c.expires_at) AS deadline, coalesce(d.collapsed_into, d.message_id) AS grp,
           CASE WHEN m.topic IS NULL THEN '' WHEN tc.topic IS NOT NULL THEN m.topic ELSE '*' END AS topic_key,
           u.segment
      FROM gov.deferred d
      JOIN gov.messages m ON m.user_id = d.user_id AND m.message_id = d.message_id
      JOIN gov.message_content c ON c.user_id = d.user_id AND c.message_id = d.message_id
      LEFT JOIN gov.message_content gc ON gc.user_id = d.user_id AND gc.message_id = d.collapsed_into
      LEFT JOIN gov.users u ON u.user_id = d.user_id
      LEFT JOIN (SELECT DISTINCT k.topic FROM gov.caps k WHERE k.scope = 'topic') tc ON tc.topic = m.topic
     WHERE d.state = 'expired' AND d.outcome = 'ttl_expired'
), groups AS (  -- one row per waiting group (its messages share its deadline), from its first hold
    SELECT e.user_id, e.grp, e.tier, e.topic, e.topic_key, e.segment, min(e.enqueued_at) AS since,
           max(e.deadline) AS deadline
      FROM e
     GROUP BY e.user_id, e.grp, e.tier, e.topic, e.topic_key, e.segment
), rules AS (  -- each group's rules, by the budget each one counts
    SELECT g.user_id, g.grp, r.windows, r.caps,
           CASE WHEN r.scope = 'topic' THEN 'topic:' || g.topic ELSE r.budget END AS budget
      FROM groups g
      LEFT JOIN (SELECT DISTINCT rs.tier, rs.topic, rs.segment FROM gov.compiled_rules rs) own
        ON own.tier = g.tier AND own.topic = g.topic_key AND own.segment = g.segment
      JOIN gov.compiled_rules r
        ON r.tier = g.tier AND r.topic = g.topic_key AND r.segment = coalesce(own.segment, '')
), taken AS (  -- later deadlines sent in one of those budgets while the group waited
    SELECT DISTINCT g.user_id, g.grp, s.message_id, s.sent_at
      FROM groups g
      JOIN gov.sends s ON s.user_id = g.user_id AND s.sent_at > g.since AND s.sent_at < g.deadline
                      AND s.message_id <> g.grp
      JOIN gov.message_content sc ON sc.user_id = s.user_id AND sc.message_id = s.message_id
                                 AND sc.expires_at > g.deadline
      JOIN rules r ON r.user_id = g.user_id AND r.grp = g.grp AND r.budget = s.budget
     WHERE s.budget IN (g.tier, 'topic:' || g.topic)  -- its tier's or its topic's slot, not global's
), counted AS (  -- every window of every rule of the group at that moment, without that send
    SELECT t.user_id, t.grp, t.message_id, t.sent_at, x.c, count(s2.user_id) AS n
      FROM taken t
      JOIN rules r ON r.user_id = t.user_id AND r.grp = t.grp
     CROSS JOIN LATERAL unnest(r.windows, r.caps) AS x(w, c)
      LEFT JOIN gov.sends s2 ON s2.user_id = t.user_id AND s2.budget = r.budget AND s2.message_id <> t.message_id
                            AND s2.sent_at > t.sent_at - x.w * interval '1 millisecond'
                            AND s2.sent_at <= t.sent_at
     GROUP BY t.user_id, t.grp, t.message_id, t.sent_at, r.budget, x.w, x.c
), stolen AS (  -- ... where the group would have passed all of them
    SELECT c.user_id, c.grp, c.sent_at
      FROM counted c
     GROUP BY c.user_id, c.grp, c.message_id, c.sent_at
    HAVING bool_and(c.n < c.c)
), flagged AS (  -- each expired message held before such a send
    SELECT DISTINCT e.user_id, e.hold_id
      FROM e JOIN stolen st ON st.user_id = e.user_id AND st.grp = e.grp AND st.sent_at > e.enqueued_at
)
SELECT e.tier, count(*) AS expired, count(f.hold_id) AS later_deadline
  FROM e
  LEFT JOIN flagged f ON f.user_id = e.user_id AND f.hold_id = e.hold_id
 GROUP BY e.tier
 ORDER BY e.tier;

-- name: sim_hour_curve
-- All users' estimated click rate by hour (gov.hour_curves_v1), for the best-hours comparison.
SELECT c.hour, c.estimate
  FROM gov.hour_curves_v1(%(since)s, %(now)s, %(strength)s) c
 WHERE c.segment IS NULL
 ORDER BY c.hour;

-- name: sim_best_hours
-- Every user's estimated best hour with their displays and clicks in the window.
SELECT e.user_id, max(e.hour) FILTER (WHERE e.best) AS hour, sum(e.displays) AS displays, sum(e.clicks) AS clicks
  FROM gov.user_hour_estimates(%(since)s, %(now)s, %(strength)s, NULL) e
 GROUP BY e.user_id
 ORDER BY e.user_id;

-- name: sim_reach_curve
-- All users' estimated reach by hour (gov.hour_curves_v2, its defaults), for the best-hours comparison.
SELECT c.hour, c.estimate
  FROM gov.hour_curves_v2(%(since)s, %(now)s) c
 WHERE c.segment IS NULL
 ORDER BY c.hour;

-- name: sim_best_reach
-- Every user's best hour by reach (gov.best_hours_v2's defaults) with their deliveries in the window.
SELECT e.user_id, max(e.hour) FILTER (WHERE e.best) AS hour, sum(e.deliveries) AS deliveries
  FROM gov.user_reach_estimates(%(since)s, %(now)s, 2, '5 minutes', NULL) e
 GROUP BY e.user_id
 ORDER BY e.user_id;

-- name: sim_timing_enabled
-- The policy's [timing] (the simulation refreshes the timing priors daily when it is on).
SELECT coalesce((SELECT s.timing_enabled FROM gov.settings s), false);

-- name: sim_set_timing
-- `gov simulate --warm-days`: the policy's [timing] off for the first days, on from then, as
-- an operator who applies the policy with it on that midnight.
UPDATE gov.settings SET timing_enabled = %(on)s RETURNING timing_enabled;

-- name: sim_refresh_timing
-- The daily cron of a deployment with [timing] on, at the simulated midnight.
SELECT gov.refresh_timing_curves_v1(p_now => %(now)s);
