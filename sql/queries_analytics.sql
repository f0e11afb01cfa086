-- Named statements for analysts: telemetry events, the fatigue report, revocation
-- suspects, the what-if replay, and the analyst role.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: record_event
SELECT gov.record_event_v1(%(user_id)s, %(message_id)s, %(event)s, %(subscription_id)s, %(at)s);

-- name: fatigue_report
SELECT bucket, subscribers, accepted, displays, clicks, closes, unsubscribes,
       ctr, unsubscribe_rate, display_rate, close_to_click, crossover
  FROM gov.fatigue_report_v1(%(since)s, %(now)s, %(segment)s)
 ORDER BY bucket;

-- name: fatigue_marginal
SELECT segment, group_no, position_from, position_to, sends, clicks, unsubscribes,
       click_rate, click_low, click_high, unsubscribe_rate, unsubscribe_low, unsubscribe_high,
       difference_low, crossover, verdict, more_sends
  FROM gov.fatigue_marginal_v1(%(since)s, %(now)s, %(min_sends)s)
 ORDER BY segment = '*' DESC, segment, group_no;

-- name: revocation_suspects
SELECT user_id, accepted, first_accepted_at, last_accepted_at, last_display_at, live_subscriptions
  FROM gov.revocation_suspects_v1(%(since)s, %(min_accepted)s, %(now)s);

-- name: whatif_summary
-- One replay (gov.whatif_v1), summarised per tier, topic, campaign and replayed reason.
SELECT CASE WHEN grouping(w.tier) = 0 THEN 'tier'
            WHEN grouping(w.topic) = 0 THEN 'topic'
            WHEN grouping(w.campaign_id) = 0 THEN 'campaign'
            WHEN grouping(w.would_reason) = 0 THEN 'reason'
            ELSE 'total' END AS dimension,
       coalesce(w.tier, w.topic, w.campaign_id, w.would_reason) AS key,
       count(*) AS messages,
       count(*) FILTER (WHERE w.was_allowed) AS allowed,
       count(*) FILTER (WHERE w.would_allow) AS would_allow,
       count(*) FILTER (WHERE w.was_allowed AND NOT w.would_allow) AS extra_suppressed,
       count(*) FILTER (WHERE NOT w.was_allowed AND w.would_allow) AS freed
  FROM gov.whatif_v1(%(since)s, %(now)s) w
 GROUP BY GROUPING SETS ((), (w.tier), (w.topic), (w.campaign_id), (w.would_reason))
 ORDER BY grouping(w.tier), grouping(w.topic), grouping(w.campaign_id), grouping(w.would_reason),
          key NULLS FIRST;

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %(role)s);

-- name: create_analyst_role
-- {role} is composed with psycopg.sql.Identifier, never pasted text.
CREATE ROLE {role} NOLOGIN;

-- name: grant_analyst_schema
GRANT USAGE ON SCHEMA gov TO {role};

-- name: grant_analyst_select
GRANT SELECT ON gov.push_suppressions, gov.push_events, gov.messages, gov.sends,
                gov.tiers, gov.tier_consumes, gov.caps, gov.segment_caps,
                gov.campaign_shortfall, gov.suppressions_daily, gov.revocation_suspects,
                gov.deferred, gov.deferral_outcomes, gov.segment_suppressions_daily, gov.segment_sizes,
                gov.user_segments, gov.hour_curve
   TO {role};

-- name: grant_analyst_subscription_columns
-- endpoint is a capability URL and p256dh/auth are keys: never granted.
GRANT SELECT (id, user_id, created_at, retired_at, retired_reason) ON gov.subscriptions TO {role};
