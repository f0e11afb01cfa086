-- gov: analytics. Telemetry (gov.push_events) and the fatigue report that reads it,
-- revocation suspects, the analysts' views, and the what-if replay behind
-- `gov policy whatif`.

-- Nothing here is on the decision's path. The one hook into the send path is a trigger
-- on gov.delivery_attempts that copies accepted attempts into the telemetry.
--
-- Stable surface for analysts: gov.push_events, gov.fatigue_report_v1, gov.fatigue_marginal_v1,
-- gov.revocation_suspects(_v1), gov.campaign_shortfall, gov.suppressions_daily,
-- gov.best_hours_v1, gov.hour_curves_v1, gov.hour_curve, gov.best_hours_v2 and gov.hour_curves_v2
-- (docs/analysts.md). Errors raised on purpose use SQLSTATE GV003 (an event refused).

-- ---------------------------------------------------------------- telemetry

-- Copy an accepted attempt into the telemetry at the attempt's own time (so a simulation
-- clock that drives the runner drives the report too). A redelivery is the same event.
-- Guarded by EXISTS so telemetry can never make the runner's record_attempt fail.
CREATE FUNCTION gov.push_events_from_attempt() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gov.push_events (user_id, message_id, subscription_id, event, created_at)
    SELECT NEW.user_id, NEW.message_id, NEW.subscription_id, 'accepted', NEW.attempted_at
     WHERE EXISTS (SELECT 1 FROM gov.messages m
                    WHERE m.user_id = NEW.user_id AND m.message_id = NEW.message_id)
    ON CONFLICT ON CONSTRAINT push_events_once DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER delivery_attempts_accepted_event
    AFTER INSERT ON gov.delivery_attempts
    FOR EACH ROW WHEN (NEW.outcome = 'accepted')
    EXECUTE FUNCTION gov.push_events_from_attempt();

-- Record one event: display, click, close or unsubscribe from the service worker, or
-- accepted from a sender that delivers outside gov. Refused (SQLSTATE GV003, naming
-- the ids) when the event is unknown, when gov never decided that message for that user
-- or suppressed it (it was never sent), or when the subscription is not the user's.
-- True when recorded, false when it already was (idempotent).
CREATE FUNCTION gov.record_event_v1(
    p_user_id         text,
    p_message_id      text,
    p_event           text,
    p_subscription_id bigint      DEFAULT NULL,
    p_at              timestamptz DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_allowed boolean;
    v_id      bigint;
BEGIN
    IF p_event IS NULL OR p_event NOT IN ('accepted', 'display', 'click', 'close', 'unsubscribe') THEN
        RAISE EXCEPTION 'unknown event % for message % of user % (expected accepted, display, click, close or unsubscribe)',
            coalesce(quote_literal(left(p_event, 64)), 'NULL'), left(p_message_id, 64), left(p_user_id, 64)
            USING ERRCODE = 'GV003';
    END IF;
    IF NOT isfinite(p_at) THEN  -- an event at infinity would count in every later report
        RAISE EXCEPTION 'an event''s moment must be finite, not %', p_at USING ERRCODE = 'GV003';
    END IF;
    SELECT m.allowed INTO v_allowed
      FROM gov.messages m WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown message % for user %: gov decided no such message', p_message_id, p_user_id
            USING ERRCODE = 'GV003';
    END IF;
    IF NOT v_allowed THEN
        RAISE EXCEPTION 'message % for user % was suppressed, never sent: no % can follow it',
            p_message_id, p_user_id, p_event
            USING ERRCODE = 'GV003';
    END IF;
    IF p_subscription_id IS NOT NULL THEN
        PERFORM 1 FROM gov.subscriptions s WHERE s.id = p_subscription_id AND s.user_id = p_user_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'subscription % is not one of user %''s (message %)',
                p_subscription_id, p_user_id, p_message_id
                USING ERRCODE = 'GV003';
        END IF;
    END IF;
    INSERT INTO gov.push_events (user_id, message_id, subscription_id, event, created_at)
    VALUES (p_user_id, p_message_id, p_subscription_id, p_event, coalesce(p_at, clock_timestamp()))
    ON CONFLICT ON CONSTRAINT push_events_once DO NOTHING
    RETURNING id INTO v_id;
    RETURN v_id IS NOT NULL;
END;
$$;

-- ---------------------------------------------------------------- the fatigue report

-- The four signals by trailing-window send volume, as the seed's weekly report, for the
-- window (p_now - p_since, p_now]. Definitions (docs/analysts.md):
--   sends        per user: the messages a push service accepted for them in the window
--                (one message on two of a user's browsers is one send)
--   bucket       least(sends, 8); users with no accepted send are not in any bucket; a
--                user who unsubscribed is bucketed by the sends of the p_since before it
--   subscribers  users in the bucket (with p_segment: who got a segment message)
--   accepted     their accepted messages (with p_segment: the segment's only)
--   displays, clicks, closes
--                of those messages, how many drew at least one such event by p_now
--   unsubscribes subscribers of the bucket with an unsubscribe event in the window
--   ctr = clicks / accepted, display_rate = displays / accepted,
--   unsubscribe_rate = unsubscribes / subscribers, close_to_click = closes / clicks
--   crossover    true on the first bucket b where, stepping up from the nearest lower
--                bucket present, unsubscribes per subscriber rise (Δ > 0) and rise by more
--                than clicks per subscriber do: Δ(unsubscribes/subscribers) >
--                Δ(clicks/subscribers). Both Δ are over the same step, so dividing them
--                by the sends it adds (per extra send) would not change the comparison.
-- p_segment is a campaign id prefix ('digest-' matches digest-2026-07-26): buckets still
-- count every send, since fatigue comes from the total, but the engagement columns
-- count only the segment's messages ("CTR within the same campaign type").
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (the query is the same; #variable_conflict lets its columns keep
-- the names of the function's output columns).
CREATE FUNCTION gov.fatigue_report_v1(
    p_since   interval    DEFAULT '7 days',
    p_now     timestamptz DEFAULT NULL,
    p_segment text        DEFAULT NULL
) RETURNS TABLE (
    bucket           integer,
    subscribers      bigint,
    accepted         bigint,
    displays         bigint,
    clicks           bigint,
    closes           bigint,
    unsubscribes     bigint,
    ctr              numeric,
    unsubscribe_rate numeric,
    display_rate     numeric,
    close_to_click   numeric,
    crossover        boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_end      timestamptz := coalesce(p_now, clock_timestamp());
    v_start    timestamptz := coalesce(p_now, clock_timestamp()) - p_since;
    v_accepted jsonb;
    v_reacted  jsonb;
    v_left     jsonb;
    v_segment  jsonb;
    v_buckets  jsonb;
BEGIN
    -- gov's tables are read first, one plain statement each (on a Citus cluster each runs
    -- on the shards; joined in one statement as CTEs, a cluster lost rows), then the
    -- buckets are counted from those rows, then the steps between the buckets.
    -- every acceptance a volume can count: a leaver's volume reaches p_since before their
    -- leaving, which is inside the window
    SELECT jsonb_agg(jsonb_build_array(e.user_id, e.message_id, e.created_at)) INTO v_accepted
      FROM gov.push_events e
     WHERE e.event = 'accepted' AND e.created_at > v_start - p_since AND e.created_at <= v_end;
    SELECT jsonb_agg(jsonb_build_array(r.user_id, r.message_id, r.displayed, r.clicked, r.closed)) INTO v_reacted
      FROM (SELECT e.user_id, e.message_id, bool_or(e.event = 'display') AS displayed,
                   bool_or(e.event = 'click') AS clicked, bool_or(e.event = 'close') AS closed
              FROM gov.push_events e
             WHERE e.event IN ('display', 'click', 'close') AND e.created_at <= v_end
             GROUP BY e.user_id, e.message_id) r;
    SELECT jsonb_agg(jsonb_build_array(e.user_id, e.created_at)) INTO v_left
      FROM gov.push_events e
     WHERE e.event = 'unsubscribe' AND e.created_at > v_start AND e.created_at <= v_end;
    IF p_segment IS NOT NULL THEN
        SELECT jsonb_agg(jsonb_build_array(m.user_id, m.message_id)) INTO v_segment
          FROM gov.messages m
         WHERE starts_with(m.campaign_id, p_segment);
    END IF;

        WITH accepted AS (
            SELECT x ->> 0 AS user_id, x ->> 1 AS message_id, (x ->> 2)::timestamptz AS created_at
              FROM jsonb_array_elements(coalesce(v_accepted, '[]')) x
        ),
        reacted AS (
            SELECT x ->> 0 AS user_id, x ->> 1 AS message_id, (x ->> 2)::boolean AS displayed,
                   (x ->> 3)::boolean AS clicked, (x ->> 4)::boolean AS closed
              FROM jsonb_array_elements(coalesce(v_reacted, '[]')) x
        ),
        left_events AS (
            SELECT x ->> 0 AS user_id, (x ->> 1)::timestamptz AS created_at
              FROM jsonb_array_elements(coalesce(v_left, '[]')) x
        ),
        in_segment AS (
            SELECT x ->> 0 AS user_id, x ->> 1 AS message_id
              FROM jsonb_array_elements(coalesce(v_segment, '[]')) x
        ),
        delivered AS (
            SELECT a.user_id, a.message_id
              FROM accepted a
             WHERE a.created_at > v_start
             GROUP BY a.user_id, a.message_id
        ),
        left_at AS (
            -- when a user unsubscribed in the window: their volume is what they had received
            -- in the p_since before that moment, not what the window holds (an early leaver's
            -- few sends before leaving would put them in a low bucket and fake a crossover)
            SELECT l.user_id, min(l.created_at) AS at FROM left_events l GROUP BY l.user_id
        ),
        volume AS (
            SELECT d.user_id, least(count(DISTINCT e.message_id), 8)::integer AS bucket
              FROM (SELECT DISTINCT d0.user_id FROM delivered d0) d
              LEFT JOIN left_at l ON l.user_id = d.user_id
              JOIN accepted e
                ON e.user_id = d.user_id
               AND e.created_at > coalesce(l.at, v_end) - p_since
               AND e.created_at <= coalesce(l.at, v_end)
             GROUP BY d.user_id
        ),
        reactions AS (
            SELECT d.user_id, d.message_id,
                   coalesce(bool_or(e.displayed), false) AS displayed,
                   coalesce(bool_or(e.clicked), false) AS clicked,
                   coalesce(bool_or(e.closed), false) AS closed
              FROM delivered d
              LEFT JOIN reacted e ON e.user_id = d.user_id AND e.message_id = d.message_id
             WHERE p_segment IS NULL
                OR EXISTS (SELECT 1 FROM in_segment m WHERE m.user_id = d.user_id AND m.message_id = d.message_id)
             GROUP BY d.user_id, d.message_id
        ),
        unsubscribed AS (
            SELECT DISTINCT l.user_id FROM left_events l
        ),
        per_user AS (
            SELECT r.user_id, v.bucket,
                   count(*) AS accepted,
                   count(*) FILTER (WHERE r.displayed) AS displays,
                   count(*) FILTER (WHERE r.clicked) AS clicks,
                   count(*) FILTER (WHERE r.closed) AS closes
              FROM reactions r JOIN volume v ON v.user_id = r.user_id
             GROUP BY r.user_id, v.bucket
        ),
        per_bucket AS (
            SELECT p.bucket,
                   count(*) AS subscribers,
                   sum(p.accepted)::bigint AS accepted,
                   sum(p.displays)::bigint AS displays,
                   sum(p.clicks)::bigint AS clicks,
                   sum(p.closes)::bigint AS closes,
                   count(u.user_id) AS unsubscribes
              FROM per_user p LEFT JOIN unsubscribed u ON u.user_id = p.user_id
             GROUP BY p.bucket
        )
        SELECT jsonb_agg(to_jsonb(pb)) INTO v_buckets FROM per_bucket pb;

    RETURN QUERY
        WITH per_bucket AS (
            SELECT * FROM jsonb_to_recordset(coalesce(v_buckets, '[]'))
                       AS (bucket integer, subscribers bigint, accepted bigint, displays bigint, clicks bigint,
                           closes bigint, unsubscribes bigint)
        ),
        steps AS (
            SELECT b.*,
                   b.clicks::numeric / b.subscribers
                       - lag(b.clicks::numeric / b.subscribers) OVER (ORDER BY b.bucket) AS d_clicks,
                   b.unsubscribes::numeric / b.subscribers
                       - lag(b.unsubscribes::numeric / b.subscribers) OVER (ORDER BY b.bucket) AS d_unsubscribes
              FROM per_bucket b
        ),
        marked AS (
            SELECT s.*, coalesce(s.d_unsubscribes > 0 AND s.d_unsubscribes > s.d_clicks, false) AS crosses
              FROM steps s
        )
        SELECT m.bucket, m.subscribers, m.accepted, m.displays, m.clicks, m.closes, m.unsubscribes,
               round(m.clicks::numeric / nullif(m.accepted, 0), 6),
               round(m.unsubscribes::numeric / m.subscribers, 6),
               round(m.displays::numeric / nullif(m.accepted, 0), 6),
               round(m.closes::numeric / nullif(m.clicks, 0), 6),
               m.crosses AND NOT coalesce(bool_or(m.crosses) OVER (ORDER BY m.bucket
                                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                                          false)
          FROM marked m
         ORDER BY m.bucket;
END;
$$;

-- ---------------------------------------------------------------- the marginal fatigue measure

-- Which segment each user is in, for analysts (gov.users holds private settings too: time
-- zone, quiet hours). Users without a segment are left out.
CREATE VIEW gov.user_segments AS
SELECT u.user_id, u.segment FROM gov.users u WHERE u.segment IS NOT NULL;

-- The 95 % Wilson score interval of a proportion: p_successes out of p_trials (NULLs
-- when p_trials is 0, and when the counts are no proportion's or p_z is negative: more
-- successes than trials, fewer than none; counts may be fractional, for projections).
-- Good near 0 and with few trials, where the normal interval is not. Another p_z,
-- another confidence.
CREATE FUNCTION gov.wilson_interval_v1(
    p_successes double precision,
    p_trials    double precision,
    p_z         double precision DEFAULT 1.959963984540054,
    OUT low     double precision,
    OUT high    double precision
)
LANGUAGE sql IMMUTABLE AS $$
    SELECT (x.p + x.z2 / (2 * x.n) - p_z * sqrt(x.p * (1 - x.p) / x.n + x.z2 / (4 * x.n * x.n))) / (1 + x.z2 / x.n),
           (x.p + x.z2 / (2 * x.n) + p_z * sqrt(x.p * (1 - x.p) / x.n + x.z2 / (4 * x.n * x.n))) / (1 + x.z2 / x.n)
      FROM (SELECT p_successes / d.n AS p, d.n, p_z * p_z AS z2
              -- n is NULL outside the domain, so is every bound (no error at planning either,
              -- where constant arguments are folded before any WHERE could rule them out)
              FROM (SELECT CASE WHEN p_trials > 0 AND p_successes BETWEEN 0 AND p_trials AND p_z >= 0
                                THEN p_trials END AS n) d) x
$$;

-- The lower confidence bound of (p_unsubscribes - p_clicks) / p_sends, the unsubscribe rate
-- minus the click rate of the same sends: Newcombe's hybrid score interval, from the Wilson
-- bounds of the two rates at p_z. Above 0: the unsubscribe rate is the higher one. NULL
-- where either interval is (no sends, counts that are no proportion's).
CREATE FUNCTION gov.difference_low_v1(
    p_unsubscribes double precision,
    p_clicks       double precision,
    p_sends        double precision,
    p_z            double precision DEFAULT 1.959963984540054
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_unsubscribes - p_clicks) / nullif(p_sends, 0)
           - sqrt((p_unsubscribes / nullif(p_sends, 0) - u.low) ^ 2 + (c.high - p_clicks / nullif(p_sends, 0)) ^ 2)
      FROM gov.wilson_interval_v1(p_unsubscribes, p_sends, p_z) u,
           gov.wilson_interval_v1(p_clicks, p_sends, p_z) c
     WHERE u.low IS NOT NULL AND c.high IS NOT NULL
$$;

-- How many more sends, at the same rates, before gov.difference_low_v1 rises above 0: the
-- smallest m for which the counts scaled to p_sends + m confirm it (bisection). NULL when
-- the unsubscribe rate is not above the click rate (no amount of data would confirm it),
-- 0 when it is confirmed already.
CREATE FUNCTION gov.sends_to_decide_v1(
    p_unsubscribes bigint,
    p_clicks       bigint,
    p_sends        bigint,
    p_z            double precision DEFAULT 1.959963984540054
) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_pu  double precision;
    v_pc  double precision;
    v_lo  bigint := 0;  -- not enough (or none needed)
    v_hi  bigint := 1;  -- enough
    v_mid bigint;
BEGIN
    -- (a negative p_z is no confidence level: NULL, as gov.wilson_interval_v1 gives)
    IF p_sends IS NULL OR p_sends <= 0 OR p_unsubscribes <= p_clicks OR p_z IS NULL OR NOT p_z >= 0
       OR NOT p_z < 'Infinity'::double precision THEN
        RETURN NULL;
    END IF;
    IF gov.difference_low_v1(p_unsubscribes, p_clicks, p_sends, p_z) > 0 THEN
        RETURN 0;
    END IF;
    v_pu := p_unsubscribes::double precision / p_sends;
    v_pc := p_clicks::double precision / p_sends;
    WHILE NOT gov.difference_low_v1(v_pu * (p_sends + v_hi), v_pc * (p_sends + v_hi), p_sends + v_hi, p_z) > 0 LOOP
        v_lo := v_hi;
        v_hi := v_hi * 2;
    END LOOP;
    WHILE v_hi - v_lo > 1 LOOP
        v_mid := (v_lo + v_hi) / 2;
        IF gov.difference_low_v1(v_pu * (p_sends + v_mid), v_pc * (p_sends + v_mid), p_sends + v_mid, p_z) > 0 THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN v_hi;
END;
$$;

-- The marginal fatigue measure (docs/analysts.md): what the n-th send of a week costs and
-- earns, per send, overall and per segment, for the sends accepted in the window
-- (p_now - p_since, p_now]. Definitions:
--   send         a message a push service accepted for the user (the 'accepted' event;
--                one message on two browsers is one send), at its first acceptance
--   position     the user's sends accepted in the 7 days before it (0: the first of the
--                week; sends before the window count, so positions are right at its start)
--   clicked      the send drew a click (by p_now)
--   unsubscribed the user's first unsubscribe (by p_now) is charged to one send: the one
--                the event names if it is an accepted send at or before it, else the last
--                send before it. Sends after the charged one are left out (a user who left
--                can neither click nor leave again)
--   segment      gov.users.segment (through gov.user_segments, which analysts may read);
--                '(none)' for users without one; '*' is every user
--   groups       positions ascending, merged upward until a group holds p_min_sends
--                sends; a last group short of it joins the one before
--   rates        clicks / sends and unsubscribes / sends, each with its 95 % Wilson interval
--   difference_low  the one-sided 95 % lower bound of unsubscribe rate - click rate
--                (Newcombe's hybrid score interval from the two rates' 90 % Wilson bounds:
--                "unsubscribes exceed clicks" is a one-sided claim)
--   crossover    true on one group per segment: where the unsubscribe rate overtakes the
--                click rate for good. The intervals must say so: some group's difference_low
--                is above 0 (the first such group confirms it); the crossover is the first
--                group of the unbroken run of groups whose unsubscribe rate exceeds their
--                click rate that ends at the confirming group
--   verdict      per segment: 'crossover'; 'not enough data' when some group's unsubscribe
--                rate exceeds its click rate but no bound confirms it (more_sends: how many
--                more sends at the same rates would, for the nearest such group);
--                'not reached' when no group's does
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (#variable_conflict lets the columns keep the output columns' names).
CREATE FUNCTION gov.fatigue_marginal_v1(
    p_since     interval    DEFAULT '28 days',
    p_now       timestamptz DEFAULT NULL,
    p_min_sends integer     DEFAULT 800
) RETURNS TABLE (
    segment          text,
    group_no         integer,
    position_from    integer,
    position_to      integer,
    sends            bigint,
    clicks           bigint,
    unsubscribes     bigint,
    click_rate       numeric,
    click_low        numeric,
    click_high       numeric,
    unsubscribe_rate numeric,
    unsubscribe_low  numeric,
    unsubscribe_high numeric,
    difference_low   numeric,
    crossover        boolean,
    verdict          text,
    more_sends       bigint
)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_positions jsonb;
BEGIN
    IF p_min_sends IS NULL OR p_min_sends < 0 THEN
        RAISE EXCEPTION 'fatigue: the sends a group holds at least must be a count, not %',
            coalesce(p_min_sends::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    -- Two statements: the sends per position from the events first, then the merging walk
    -- (a recursive CTE) over those few rows alone; on a Citus cluster a recursive CTE may
    -- not share a statement with the distributed tables.
        WITH bounds AS (
            SELECT b.t_end - p_since AS t_start, b.t_end
              FROM (SELECT coalesce(p_now, clock_timestamp()) AS t_end) b
        ),
        -- (what reads gov's tables is MATERIALIZED: on a Citus cluster each runs on the
        -- shards and the rest on its few rows, with no subquery reaching back to a shard)
        accepted AS MATERIALIZED (
            SELECT e.user_id, e.message_id, min(e.created_at) AS at
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'accepted' AND e.created_at > w.t_start - interval '7 days' AND e.created_at <= w.t_end
             GROUP BY e.user_id, e.message_id
        ),
        numbered AS (
            SELECT a.user_id, a.message_id, a.at,
                   row_number() OVER (PARTITION BY a.user_id ORDER BY a.at, a.message_id) AS rn,
                   count(*) OVER (PARTITION BY a.user_id ORDER BY a.at
                                  RANGE BETWEEN UNBOUNDED PRECEDING AND interval '7 days' PRECEDING) AS aged
              FROM accepted a
        ),
        left_at AS MATERIALIZED (
            SELECT DISTINCT ON (e.user_id) e.user_id, e.message_id, e.created_at AS at
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'unsubscribe' AND e.created_at <= w.t_end
             ORDER BY e.user_id, e.created_at, e.id
        ),
        clicked AS MATERIALIZED (
            SELECT DISTINCT e.user_id, e.message_id
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'click' AND e.created_at <= w.t_end
        ),
        segments AS MATERIALIZED (
            SELECT u.user_id, u.segment FROM gov.user_segments u
        ),
        charged AS (  -- the unsubscribed message's number, else the last before leaving, else 0
            SELECT l.user_id,
                   coalesce(max(n.rn) FILTER (WHERE n.message_id = l.message_id), max(n.rn), 0) AS rn
              FROM left_at l
              LEFT JOIN numbered n ON n.user_id = l.user_id AND n.at <= l.at
             GROUP BY l.user_id
        ),
        counted AS (
            SELECT coalesce(u.segment, '(none)') AS segment,
                   (n.rn - 1 - n.aged)::integer AS position,
                   k.user_id IS NOT NULL AS clicked,
                   coalesce(n.rn = c.rn, false) AS unsubscribed
              FROM numbered n CROSS JOIN bounds w
              LEFT JOIN clicked k ON k.user_id = n.user_id AND k.message_id = n.message_id
              LEFT JOIN charged c ON c.user_id = n.user_id
              LEFT JOIN segments u ON u.user_id = n.user_id
             WHERE n.at > w.t_start AND (c.rn IS NULL OR n.rn <= c.rn)
        ),
        per_position AS (
            SELECT k.segment, k.position, k.sends, k.clicks, k.unsubscribes,
                   row_number() OVER (PARTITION BY k.segment ORDER BY k.position) AS ord
              FROM (SELECT coalesce(c.segment, '*') AS segment, c.position, count(*) AS sends,
                           count(*) FILTER (WHERE c.clicked) AS clicks,
                           count(*) FILTER (WHERE c.unsubscribed) AS unsubscribes
                      FROM counted c
                     GROUP BY GROUPING SETS ((c.segment, c.position), (c.position))) k
        )
        SELECT coalesce(jsonb_agg(to_jsonb(pp)), '[]') INTO v_positions FROM per_position pp;

    RETURN QUERY
        WITH RECURSIVE per_position AS (
            SELECT * FROM jsonb_to_recordset(v_positions)
                       AS (segment text, position integer, sends bigint, clicks bigint, unsubscribes bigint, ord bigint)
        ),
        walk AS (  -- merge upward: a group closes once it holds p_min_sends sends
            SELECT p.segment, p.ord, 1 AS group_no, p.sends AS held
              FROM per_position p WHERE p.ord = 1
            UNION ALL
            SELECT p.segment, p.ord,
                   w.group_no + CASE WHEN w.held >= p_min_sends THEN 1 ELSE 0 END,
                   CASE WHEN w.held >= p_min_sends THEN p.sends ELSE w.held + p.sends END
              FROM walk w JOIN per_position p ON p.segment = w.segment AND p.ord = w.ord + 1
        ),
        walked AS (
            SELECT p.*, w.group_no, max(w.group_no) OVER (PARTITION BY p.segment) AS last_group,
                   sum(p.sends) OVER (PARTITION BY p.segment, w.group_no) AS group_sends
              FROM per_position p JOIN walk w ON w.segment = p.segment AND w.ord = p.ord
        ),
        grouped AS (  -- a last group short of p_min_sends joins the one before
            SELECT g.segment, g.group_no::integer AS group_no, min(g.position) AS position_from,
                   max(g.position) AS position_to, sum(g.sends)::bigint AS sends,
                   sum(g.clicks)::bigint AS clicks, sum(g.unsubscribes)::bigint AS unsubscribes
              FROM (SELECT x.segment, x.position, x.sends, x.clicks, x.unsubscribes,
                           CASE WHEN x.group_no = x.last_group AND x.group_sends < p_min_sends AND x.last_group > 1
                                THEN x.group_no - 1 ELSE x.group_no END AS group_no
                      FROM walked x) g
             GROUP BY g.segment, g.group_no
        ),
        rated AS (
            SELECT g.*, g.clicks::double precision / g.sends AS pc, g.unsubscribes::double precision / g.sends AS pu,
                   ci.low AS c_low, ci.high AS c_high, ui.low AS u_low, ui.high AS u_high,
                   gov.difference_low_v1(g.unsubscribes, g.clicks, g.sends, 1.6448536269514722) AS d_low,
                   g.unsubscribes > g.clicks AS above
              FROM grouped g
             CROSS JOIN LATERAL gov.wilson_interval_v1(g.clicks, g.sends) ci
             CROSS JOIN LATERAL gov.wilson_interval_v1(g.unsubscribes, g.sends) ui
        ),
        tested AS (
            SELECT r.*,
                   CASE WHEN r.above AND NOT r.d_low > 0
                        THEN gov.sends_to_decide_v1(r.unsubscribes, r.clicks, r.sends, 1.6448536269514722) END AS short_by
              FROM rated r
        ),
        confirmed AS (
            SELECT t.*, min(t.group_no) FILTER (WHERE t.d_low > 0) OVER (PARTITION BY t.segment) AS first_sure
              FROM tested t
        ),
        located AS (
            SELECT c.*,
                   CASE WHEN c.first_sure IS NOT NULL THEN
                       coalesce(max(c.group_no) FILTER (WHERE NOT c.above AND c.group_no < c.first_sure)
                                    OVER (PARTITION BY c.segment), 0) + 1 END AS crossing,
                   bool_or(c.above) OVER (PARTITION BY c.segment) AS any_above,
                   min(c.short_by) OVER (PARTITION BY c.segment) AS fewest_short
              FROM confirmed c
        )
        SELECT l.segment, l.group_no, l.position_from, l.position_to, l.sends, l.clicks, l.unsubscribes,
               round(l.pc::numeric, 6), round(l.c_low::numeric, 6), round(l.c_high::numeric, 6),
               round(l.pu::numeric, 6), round(l.u_low::numeric, 6), round(l.u_high::numeric, 6),
               round(l.d_low::numeric, 6),
               coalesce(l.group_no = l.crossing, false),
               CASE WHEN l.crossing IS NOT NULL THEN 'crossover'
                    WHEN l.any_above THEN 'not enough data'
                    ELSE 'not reached' END,
               CASE WHEN l.crossing IS NULL AND l.any_above THEN l.fewest_short END
          FROM located l
         ORDER BY l.segment = '*' DESC, l.segment, l.group_no;
END;
$$;

-- ---------------------------------------------------------------- the best hours

-- When a user acts on what shows up (docs/analysts.md, "The best hours"). The unit is a
-- displayed non-P0 message, placed at the LOCAL HOUR OF DAY it was displayed (its first
-- display beacon; a click without one counts as displayed when clicked), and clicked or
-- not. Display, not send and not click time: web push shows a notification when the
-- browser runs, and what matters is the hour at which a notification that shows up gets
-- acted on. P0 is left out: an order update or a passcode is opened because it is
-- urgent, not because of the hour. Hour of day only, not of the week: a user has a
-- handful of clicks a month, far too few for 168 slots (weekday x weekend doubles the
-- slots for no gain the data could show).
--
-- Local: in gov.users.time_zone, through PostgreSQL's zone rules, so the hours follow DST
-- (08:30 local is hour 8 in winter and in summer); a user who never told gov a zone
-- is counted in UTC hours.
--
-- gov.display_hours counts, per user (p_user_id NULL: every user) and hour, the displays
-- of the window (p_now - p_since, p_now] and the clicks among them. Internal; SECURITY
-- DEFINER because it reads gov.users (time zones are private settings the analyst role
-- may not read): it returns counts per hour, never a zone.
CREATE FUNCTION gov.display_hours(
    p_since   interval,
    p_now     timestamptz,
    p_user_id text DEFAULT NULL
) RETURNS TABLE (user_id text, segment text, hour integer, displays bigint, clicks bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- planned for each call's arguments (migration 0055): a generic plan of "p_user_id IS NULL
-- OR e.user_id = p_user_id" reads every user's events of the window, even for one user
SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT x.user_id, u.segment,
           date_part('hour', x.shown_at AT TIME ZONE coalesce(u.time_zone, 'UTC'))::integer AS hour,
           count(*) AS displays, count(*) FILTER (WHERE x.clicked) AS clicks
      FROM (SELECT e.user_id, e.message_id,
                   coalesce(min(e.created_at) FILTER (WHERE e.event = 'display'), min(e.created_at)) AS shown_at,
                   bool_or(e.event = 'click') AS clicked
              FROM gov.push_events e
             WHERE e.event IN ('display', 'click')
               AND e.created_at > p_now - p_since AND e.created_at <= p_now
               AND (p_user_id IS NULL OR e.user_id = p_user_id)
             GROUP BY e.user_id, e.message_id) x
      JOIN gov.messages m ON m.user_id = x.user_id AND m.message_id = x.message_id
      LEFT JOIN gov.users u ON u.user_id = x.user_id
     WHERE m.tier <> 'P0'
     GROUP BY x.user_id, u.segment, 3;
END;
$$;

-- The click rate by local hour of day of every user (segment NULL) and of each segment
-- with data: 24 rows each, hour 0 to 23. click_rate is the raw rate (NULL without a
-- display), estimate the beta-binomial posterior mean with p_strength pseudo-displays
-- of the level above: an hour of all users is shrunk toward all users' overall rate, an
-- hour of a segment toward all users' estimate for that hour. An hour with no data gets
-- the level above's value; one with thousands of displays its own. NULL estimates: no
-- display at all in the window.
CREATE FUNCTION gov.hour_curves_v1(
    p_since    interval         DEFAULT '56 days',
    p_now      timestamptz      DEFAULT NULL,
    p_strength double precision DEFAULT 20
) RETURNS TABLE (segment text, hour integer, displays bigint, clicks bigint,
                 click_rate double precision, estimate double precision)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    -- (NaN sorts above every number in PostgreSQL: "> 0" alone lets it and infinity in)
    IF p_strength IS NULL OR NOT p_strength > 0 OR NOT p_strength < 'Infinity'::double precision THEN
        RAISE EXCEPTION 'hour curves: the prior strength must be a positive number of displays, not %',
            coalesce(p_strength::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH d AS (
        SELECT * FROM gov.display_hours(p_since, coalesce(p_now, clock_timestamp()))
    ), hours AS (
        SELECT h::integer AS hour FROM generate_series(0, 23) h
    ), overall AS (
        SELECT sum(d.clicks)::double precision / nullif(sum(d.displays), 0) AS rate FROM d
    ), everyone AS (
        SELECT h.hour, coalesce(sum(d.displays), 0)::bigint AS displays, coalesce(sum(d.clicks), 0)::bigint AS clicks
          FROM hours h LEFT JOIN d ON d.hour = h.hour GROUP BY h.hour
    ), everyone_est AS (
        SELECT e.hour, e.displays, e.clicks,
               e.clicks::double precision / nullif(e.displays, 0) AS click_rate,
               (e.clicks + p_strength * o.rate) / (e.displays + p_strength) AS estimate
          FROM everyone e CROSS JOIN overall o
    ), segments AS (
        SELECT s.segment, h.hour,
               coalesce(sum(d.displays), 0)::bigint AS displays, coalesce(sum(d.clicks), 0)::bigint AS clicks
          FROM (SELECT DISTINCT d.segment FROM d WHERE d.segment IS NOT NULL) s
         CROSS JOIN hours h
          LEFT JOIN d ON d.segment = s.segment AND d.hour = h.hour
         GROUP BY s.segment, h.hour
    )
    SELECT NULL::text, e.hour, e.displays, e.clicks, e.click_rate, e.estimate FROM everyone_est e
    UNION ALL
    SELECT s.segment, s.hour, s.displays, s.clicks, s.clicks::double precision / nullif(s.displays, 0),
           (s.clicks + p_strength * e.estimate) / (s.displays + p_strength)
      FROM segments s JOIN everyone_est e ON e.hour = s.hour
     ORDER BY 1 NULLS FIRST, 2;
END;
$$;

-- Every user's click rate by local hour of day (p_user_id NULL: each user with a display
-- in the window; else that one user, 24 rows even without data): their own displays and
-- clicks per hour, the prior (their segment's estimate for the hour, all users' when they
-- have no segment or it has no data) and the estimate, the beta-binomial posterior mean
-- (clicks + p_strength * prior) / (displays + p_strength). best: the hour of the highest
-- estimate (the earliest on a tie); NULL estimates and best when no one displayed
-- anything in the window. Internal: gov.best_hours_v1 is one user's, and gov simulate
-- reads everyone's at once to compare them with its users' hidden hours.
CREATE FUNCTION gov.user_hour_estimates(
    p_since    interval,
    p_now      timestamptz,
    p_strength double precision,
    p_user_id  text DEFAULT NULL
) RETURNS TABLE (user_id text, hour integer, displays bigint, clicks bigint, prior double precision,
                 estimate double precision, best boolean)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH c AS (
        SELECT * FROM gov.hour_curves_v1(p_since, p_now, p_strength)
    ), d AS (
        SELECT * FROM gov.display_hours(p_since, p_now, p_user_id)
    ), who AS (
        -- one user: their segment through the analysts' view (gov.users itself is private)
        SELECT p_user_id AS user_id, (SELECT s.segment FROM gov.user_segments s WHERE s.user_id = p_user_id) AS segment
         WHERE p_user_id IS NOT NULL
        UNION ALL
        SELECT DISTINCT d.user_id, d.segment FROM d WHERE p_user_id IS NULL
    ), est AS (
        SELECT w.user_id, p.hour, coalesce(o.displays, 0)::bigint AS displays, coalesce(o.clicks, 0)::bigint AS clicks,
               coalesce(s.estimate, p.estimate) AS prior
          FROM who w
          JOIN c p ON p.segment IS NULL
          LEFT JOIN c s ON s.segment = w.segment AND s.hour = p.hour
          LEFT JOIN d o ON o.user_id = w.user_id AND o.hour = p.hour
    ), shrunk AS (
        SELECT e.user_id, e.hour, e.displays, e.clicks, e.prior,
               (e.clicks + p_strength * e.prior) / (e.displays + p_strength) AS estimate
          FROM est e
    )
    SELECT x.user_id, x.hour, x.displays, x.clicks, x.prior, x.estimate,
           CASE WHEN x.estimate IS NOT NULL
                THEN row_number() OVER (PARTITION BY x.user_id ORDER BY x.estimate DESC NULLS LAST, x.hour) = 1 END
      FROM shrunk x
     ORDER BY x.user_id, x.hour;
END;
$$;

-- One user's click rate by local hour of day (docs/analysts.md): 24 rows, as
-- gov.user_hour_estimates gives them. A user with no data gets the prior's shape, not
-- one fixed hour; one with many displays an hour their own.
CREATE FUNCTION gov.best_hours_v1(
    p_user_id  text,
    p_since    interval         DEFAULT '56 days',
    p_now      timestamptz      DEFAULT NULL,
    p_strength double precision DEFAULT 20
) RETURNS TABLE (hour integer, displays bigint, clicks bigint, prior double precision,
                 estimate double precision, best boolean)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    IF p_user_id IS NULL THEN
        RAISE EXCEPTION 'best hours: a user id is required' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT e.hour, e.displays, e.clicks, e.prior, e.estimate, e.best
      FROM gov.user_hour_estimates(p_since, coalesce(p_now, clock_timestamp()), p_strength, p_user_id) e
     ORDER BY e.hour;
END;
$$;

-- The reach by hour (docs/analysts.md, "The best hours, from reach"): whether a user's
-- browser is running when a message arrives, by local hour of DELIVERY. A push service
-- hands a message to a running browser at once, and the service worker's display beacon
-- follows within seconds; to a closed one it hands it when the browser next starts. So a
-- delivery answered by a display (or a click or close) within p_prompt of the push
-- service's acceptance says "reachable at that hour", and one answered later or never
-- says "not". Unlike clicks given a display (gov.best_hours_v1), every delivery counts,
-- whatever was sent and whatever hour the browser happened to be open: the hour is the
-- one gov chose, not one the browser chose. Every tier counts: whether a browser runs
-- does not depend on what is sent.
--
-- gov.reach_hours counts, per user (p_user_id NULL: every user) and local hour (the
-- user's gov.users.time_zone, UTC without one), the messages first accepted by a push
-- service in the window (p_now - p_since, p_now - p_prompt] (a later one's answer is
-- not in yet) and how many of them were displayed within p_prompt. Internal; SECURITY
-- DEFINER because it reads gov.users, as gov.display_hours does: counts per hour, never a zone.
CREATE FUNCTION gov.reach_hours(
    p_since   interval,
    p_now     timestamptz,
    p_prompt  interval,
    p_user_id text DEFAULT NULL
) RETURNS TABLE (user_id text, segment text, hour integer, deliveries bigint, prompt bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- planned for each call's arguments, as gov.display_hours (one user's hold reads one user's)
SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT x.user_id, u.segment,
           date_part('hour', x.delivered_at AT TIME ZONE coalesce(u.time_zone, 'UTC'))::integer AS hour,
           count(*) AS deliveries,
           count(*) FILTER (WHERE x.shown_at <= x.delivered_at + p_prompt) AS prompt
      FROM (SELECT e.user_id, e.message_id,
                   min(e.created_at) FILTER (WHERE e.event = 'accepted') AS delivered_at,
                   min(e.created_at) FILTER (WHERE e.event <> 'accepted') AS shown_at
              FROM gov.push_events e
             WHERE e.event IN ('accepted', 'display', 'click', 'close')
               AND e.created_at > p_now - p_since AND e.created_at <= p_now
               AND (p_user_id IS NULL OR e.user_id = p_user_id)
             GROUP BY e.user_id, e.message_id) x
      LEFT JOIN gov.users u ON u.user_id = x.user_id
     WHERE x.delivered_at IS NOT NULL AND x.delivered_at <= p_now - p_prompt
     GROUP BY x.user_id, u.segment, 3;
END;
$$;

-- The arguments every reach estimate refuses (SQLSTATE 22023, as gov.hour_curves_v1's).
CREATE FUNCTION gov.check_reach_args(p_strength double precision, p_prompt interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- (NaN sorts above every number in PostgreSQL: "> 0" alone lets it and infinity in)
    IF p_strength IS NULL OR NOT (p_strength > 0 AND p_strength < 'Infinity'::double precision) THEN
        RAISE EXCEPTION 'reach: the prior strength must be a positive number of deliveries, not %',
            coalesce(p_strength::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_prompt IS NULL OR p_prompt <= interval '0' OR p_prompt > interval '1 hour' THEN
        RAISE EXCEPTION 'reach: a prompt display must come within a positive interval of at most an hour, not %',
            coalesce(p_prompt::text, 'NULL') USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Every user's (segment NULL) and each segment's reach by local hour: 24 rows each.
-- deliveries and prompt are the hour's own counts, prompt_rate their ratio (NULL without
-- a delivery). estimate: the counts smoothed over the neighbouring hours (a quarter of
-- the hour before, half of the hour, a quarter of the hour after: people's days change
-- by the hour, not from one hour to the next at random) and shrunk, beta-binomial, with
-- p_strength pseudo-deliveries of the level above: all users toward their overall rate,
-- a segment toward all users' estimate for the hour. NULL estimates: no delivery at all.
CREATE FUNCTION gov.hour_curves_v2(
    p_since    interval         DEFAULT '56 days',
    p_now      timestamptz      DEFAULT NULL,
    p_strength double precision DEFAULT 2,
    p_prompt   interval         DEFAULT '5 minutes'
) RETURNS TABLE (segment text, hour integer, deliveries bigint, prompt bigint,
                 prompt_rate double precision, estimate double precision)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    PERFORM gov.check_reach_args(p_strength, p_prompt);
    RETURN QUERY
    WITH d AS (
        SELECT * FROM gov.reach_hours(p_since, coalesce(p_now, clock_timestamp()), p_prompt)
    ), kernel (shift, weight) AS (
        VALUES (-1, 0.25::double precision), (0, 0.5::double precision), (1, 0.25::double precision)
    ), counts AS (
        -- every level's 24 hours: '' all users, else a segment
        SELECT l.level, h.hour::integer AS hour,
               coalesce(sum(d.deliveries), 0)::bigint AS deliveries, coalesce(sum(d.prompt), 0)::bigint AS prompt
          FROM (SELECT ''::text AS level
                UNION SELECT DISTINCT d.segment FROM d WHERE d.segment IS NOT NULL AND d.segment <> '') l
         CROSS JOIN generate_series(0, 23) h(hour)
          LEFT JOIN d ON (l.level = '' OR d.segment = l.level) AND d.hour = h.hour
         GROUP BY l.level, 2
    ), smoothed AS (
        SELECT c.level, c.hour, c.deliveries, c.prompt,
               sum(k.weight * n.deliveries) AS n, sum(k.weight * n.prompt) AS k
          FROM counts c
         CROSS JOIN kernel k
          JOIN counts n ON n.level = c.level AND n.hour = (c.hour + k.shift + 24) % 24
         GROUP BY c.level, c.hour, c.deliveries, c.prompt
    ), overall AS (
        SELECT sum(c.prompt)::double precision / nullif(sum(c.deliveries), 0) AS rate FROM counts c WHERE c.level = ''
    ), everyone AS (
        SELECT s.hour, s.deliveries, s.prompt, (s.k + p_strength * o.rate) / (s.n + p_strength) AS estimate
          FROM smoothed s CROSS JOIN overall o WHERE s.level = ''
    )
    SELECT NULL::text, e.hour, e.deliveries, e.prompt,
           e.prompt::double precision / nullif(e.deliveries, 0), e.estimate
      FROM everyone e
    UNION ALL
    SELECT s.level, s.hour, s.deliveries, s.prompt, s.prompt::double precision / nullif(s.deliveries, 0),
           (s.k + p_strength * e.estimate) / (s.n + p_strength)
      FROM smoothed s JOIN everyone e ON e.hour = s.hour
     WHERE s.level <> ''
     ORDER BY 1 NULLS FIRST, 2;
END;
$$;

-- Every user's reach by local hour (p_user_id NULL: each user with a delivery in the
-- window; else that one user, 24 rows even without data): their own counts per hour,
-- the prior (their segment's estimate for the hour, all users' without a segment or
-- when it has no data) and the estimate, their counts smoothed as the curves' are and
-- shrunk toward the prior with p_strength pseudo-deliveries. best: the hour of the
-- highest estimate (the earliest on a tie); NULL when no one got anything in the window.
-- Internal: gov.best_hours_v2 is one user's; gov simulate reads everyone's at once.
CREATE FUNCTION gov.user_reach_estimates(
    p_since    interval,
    p_now      timestamptz,
    p_strength double precision,
    p_prompt   interval,
    p_user_id  text DEFAULT NULL
) RETURNS TABLE (user_id text, hour integer, deliveries bigint, prompt bigint, prior double precision,
                 estimate double precision, best boolean)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    PERFORM gov.check_reach_args(p_strength, p_prompt);
    RETURN QUERY
    WITH c AS (
        SELECT * FROM gov.hour_curves_v2(p_since, p_now, p_strength, p_prompt)
    ), d AS (
        SELECT * FROM gov.reach_hours(p_since, p_now, p_prompt, p_user_id)
    ), who AS (
        -- one user: their segment through the analysts' view (gov.users itself is private)
        SELECT p_user_id AS user_id, (SELECT s.segment FROM gov.user_segments s WHERE s.user_id = p_user_id) AS segment
         WHERE p_user_id IS NOT NULL
        UNION ALL
        SELECT DISTINCT d.user_id, d.segment FROM d WHERE p_user_id IS NULL
    ), kernel (shift, weight) AS (
        VALUES (-1, 0.25::double precision), (0, 0.5::double precision), (1, 0.25::double precision)
    ), counts AS (
        SELECT w.user_id, w.segment, p.hour, coalesce(o.deliveries, 0)::bigint AS deliveries,
               coalesce(o.prompt, 0)::bigint AS prompt, coalesce(g.estimate, p.estimate) AS prior
          FROM who w
          JOIN c p ON p.segment IS NULL
          LEFT JOIN c g ON g.segment = w.segment AND g.hour = p.hour
          LEFT JOIN d o ON o.user_id = w.user_id AND o.hour = p.hour
    ), shrunk AS (
        SELECT x.user_id, x.hour, x.deliveries, x.prompt, x.prior,
               (sum(k.weight * n.prompt) + p_strength * x.prior) / (sum(k.weight * n.deliveries) + p_strength)
                   AS estimate
          FROM counts x
         CROSS JOIN kernel k
          JOIN counts n ON n.user_id = x.user_id AND n.hour = (x.hour + k.shift + 24) % 24
         GROUP BY x.user_id, x.hour, x.deliveries, x.prompt, x.prior
    )
    SELECT x.user_id, x.hour, x.deliveries, x.prompt, x.prior, x.estimate,
           CASE WHEN x.estimate IS NOT NULL
                THEN row_number() OVER (PARTITION BY x.user_id ORDER BY x.estimate DESC NULLS LAST, x.hour) = 1 END
      FROM shrunk x
     ORDER BY x.user_id, x.hour;
END;
$$;

-- One user's reach by local hour (docs/analysts.md): 24 rows, as gov.user_reach_estimates
-- gives them. A user with no data gets the prior's shape, not one fixed hour.
CREATE FUNCTION gov.best_hours_v2(
    p_user_id  text,
    p_since    interval         DEFAULT '56 days',
    p_now      timestamptz      DEFAULT NULL,
    p_strength double precision DEFAULT 2,
    p_prompt   interval         DEFAULT '5 minutes'
) RETURNS TABLE (hour integer, deliveries bigint, prompt bigint, prior double precision,
                 estimate double precision, best boolean)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    IF p_user_id IS NULL THEN
        RAISE EXCEPTION 'best hours: a user id is required' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT e.hour, e.deliveries, e.prompt, e.prior, e.estimate, e.best
      FROM gov.user_reach_estimates(p_since, coalesce(p_now, clock_timestamp()), p_strength, p_prompt, p_user_id) e
     ORDER BY e.hour;
END;
$$;

-- Permission revocations, the expensive signal: users for whom push services accepted
-- at least p_min_accepted messages in the window while not one display beacon came
-- back. Acceptance stays healthy, nothing shows: the browser blocks or the OS mutes.
-- last_display_at (any time up to p_now) tells "stopped displaying" from "never did"
-- (a display beacon that was never instrumented makes everyone a suspect).
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (the query is the same; #variable_conflict lets its columns keep
-- the names of the function's output columns).
CREATE FUNCTION gov.revocation_suspects_v1(
    p_since        interval    DEFAULT '7 days',
    p_min_accepted integer     DEFAULT 3,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id            text,
    accepted           bigint,
    first_accepted_at  timestamptz,
    last_accepted_at   timestamptz,
    last_display_at    timestamptz,
    live_subscriptions bigint
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        WITH bounds AS (
            SELECT b.t_end - p_since AS t_start, b.t_end
              FROM (SELECT coalesce(p_now, clock_timestamp()) AS t_end) b
        ),
        delivered AS (
            SELECT e.user_id, count(DISTINCT e.message_id) AS accepted,
                   min(e.created_at) AS first_at, max(e.created_at) AS last_at
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'accepted' AND e.created_at > w.t_start AND e.created_at <= w.t_end
             GROUP BY e.user_id
            HAVING count(DISTINCT e.message_id) >= p_min_accepted
        )
        SELECT d.user_id, d.accepted, d.first_at, d.last_at,
               (SELECT max(x.created_at) FROM gov.push_events x
                 WHERE x.user_id = d.user_id AND x.event = 'display' AND x.created_at <= w.t_end),
               (SELECT count(*) FROM gov.subscriptions s
                 WHERE s.user_id = d.user_id AND s.retired_at IS NULL)
          FROM delivered d CROSS JOIN bounds w
         WHERE NOT EXISTS (SELECT 1 FROM gov.push_events x
                            WHERE x.user_id = d.user_id AND x.event = 'display'
                              AND x.created_at > w.t_start AND x.created_at <= w.t_end)
         ORDER BY d.accepted DESC, d.user_id;
END;
$$;

-- ---------------------------------------------------------------- views for analysts

-- Suspects over the last 7 days with at least 3 accepted sends; call
-- gov.revocation_suspects_v1 for another window or threshold.
CREATE VIEW gov.revocation_suspects AS
SELECT r.user_id, r.accepted, r.first_accepted_at, r.last_accepted_at, r.last_display_at, r.live_subscriptions
  FROM gov.revocation_suspects_v1() r;

-- All users' click rate by local hour of day over the last 56 days (segment NULL), and
-- each segment's; call gov.hour_curves_v1 for another window or prior strength.
CREATE VIEW gov.hour_curve AS
SELECT c.segment, c.hour, c.displays, c.clicks, c.click_rate, c.estimate
  FROM gov.hour_curves_v1() c;

-- Why a campaign under-delivered: per campaign and blocking rule, the suppressed
-- messages, the users they were for, and their share of every message decided for the
-- campaign. Messages without a campaign id are not a campaign and are left out.
CREATE VIEW gov.campaign_shortfall AS
SELECT s.campaign_id, s.blocked_by, s.suppressed, s.users, d.decided,
       round(s.suppressed::numeric / nullif(d.decided, 0), 4) AS share,
       s.first_at, s.last_at
  FROM (SELECT ps.campaign_id, ps.blocked_by, count(*) AS suppressed, count(DISTINCT ps.user_id) AS users,
               min(ps.created_at) AS first_at, max(ps.created_at) AS last_at
          FROM gov.push_suppressions ps
         WHERE ps.campaign_id IS NOT NULL
         GROUP BY ps.campaign_id, ps.blocked_by) s
  LEFT JOIN (SELECT m.campaign_id, count(*) AS decided
               FROM gov.messages m
              WHERE m.campaign_id IS NOT NULL
              GROUP BY m.campaign_id) d
         ON d.campaign_id = s.campaign_id;

-- Suppressions per tier and UTC day, by what the decision did with them: dropped at once
-- (a drop verb, an opt-out, a hold that could not last to its deadline), deferred
-- (quiet hours, a defer verb) or collapsed. What became of a held one later (released,
-- dropped at release, expired) is gov.deferral_outcomes'.
CREATE VIEW gov.suppressions_daily AS
SELECT (ps.created_at AT TIME ZONE 'UTC')::date AS day, ps.tier,
       count(*) AS suppressed,
       count(*) FILTER (WHERE ps.action = 'drop') AS dropped,
       count(*) FILTER (WHERE ps.action = 'defer') AS deferred,
       count(*) FILTER (WHERE ps.action = 'collapse') AS collapsed,
       count(DISTINCT ps.user_id) AS users
  FROM gov.push_suppressions ps
 GROUP BY (ps.created_at AT TIME ZONE 'UTC')::date, ps.tier;

-- Suppressions per UTC day, tier, user segment (as it was when decided; NULL: none) and
-- blocking rule: with segment caps, which segments the caps hold back, and by what.
CREATE VIEW gov.segment_suppressions_daily AS
SELECT (ps.created_at AT TIME ZONE 'UTC')::date AS day, ps.tier, ps.segment, ps.blocked_by,
       count(*) AS suppressed,
       count(DISTINCT ps.user_id) AS users
  FROM gov.push_suppressions ps
 GROUP BY (ps.created_at AT TIME ZONE 'UTC')::date, ps.tier, ps.segment, ps.blocked_by;

-- How many users each segment holds now (NULL: none), without naming anyone: gov.users
-- itself is not granted to analysts.
CREATE VIEW gov.segment_sizes AS
SELECT u.segment, count(*) AS users
  FROM gov.users u
 GROUP BY u.segment;

-- Deferral outcomes for analysts: per day held, tier, kind and state (with the reason).
CREATE VIEW gov.deferral_outcomes AS
SELECT date_trunc('day', d.enqueued_at AT TIME ZONE 'UTC')::date AS day,
       d.tier, d.kind, d.state, coalesce(d.outcome, 'waiting') AS outcome,
       count(*) AS messages,
       avg(extract(epoch FROM d.finished_at - d.enqueued_at))::numeric(12, 1) AS avg_wait_s
  FROM gov.deferred d
 GROUP BY 1, 2, 3, 4, 5;

-- ---------------------------------------------------------------- what if (gov policy whatif)

-- Replay every message decided in the window (p_now - p_since, p_now], in decision
-- order, through gov.decide_v1 at its own decided_at under the policy stored now, and
-- return its recorded verdict beside the replayed one. To try a candidate policy, store
-- it in a transaction that is rolled back afterwards (gov policy whatif does).
--
-- It changes nothing, whoever calls it: the replay runs under stand-in user ids (so no
-- real user's lock is taken and no real row is touched), seeded with each user's real
-- sends from before the window, own caps, settings and current segment (so the policy's
-- segment caps apply to each as they would today); and it runs inside a block that
-- ends by raising, which rolls every write of the replay back. Only the verdicts,
-- kept in local variables, survive. A tier the policy no longer defines replays as
-- refused with reason 'unknown_tier'.
CREATE FUNCTION gov.whatif_v1(
    p_since interval    DEFAULT '7 days',
    p_now   timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id      text,
    message_id   text,
    tier         text,
    topic        text,
    campaign_id  text,
    decided_at   timestamptz,
    was_allowed  boolean,
    was_reason   text,
    would_allow  boolean,
    would_action text,
    would_reason text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := coalesce(p_now, clock_timestamp());
    v_from     timestamptz;
    v_tag      text := 'whatif:' || md5(random()::text || clock_timestamp()::text) || ':';
    v_users    text[];
    v_ids      text[];
    v_tiers    text[];
    v_topics   text[];
    v_camps    text[];
    v_at       timestamptz[];
    v_allowed  boolean[];
    v_reasons  text[];
    v_w_allow  boolean[] := '{}';
    v_w_action text[] := '{}';
    v_w_reason text[] := '{}';
    v_n        integer;
    v_verdict  record;
BEGIN
    v_from := v_now - p_since;
    -- In decision order. A user's messages decided at one instant (a campaign's, or a held
    -- one released by gov.release_owed just before the new one) replay the allowed ones
    -- first: refusals spend nothing, so that is an order they could have been decided in,
    -- and the live policy then replays to exactly what happened (by message id alone, a
    -- later id allowed for an earlier one refused read as a change: an outside probe).
    SELECT array_agg(m.user_id ORDER BY m.decided_at, m.user_id, m.allowed DESC, m.message_id),
           array_agg(m.message_id ORDER BY m.decided_at, m.user_id, m.allowed DESC, m.message_id),
           array_agg(m.tier ORDER BY m.decided_at, m.user_id, m.allowed DESC, m.message_id),
           array_agg(m.topic ORDER BY m.decided_at, m.user_id, m.allowed DESC, m.message_id),
           array_agg(m.campaign_id ORDER BY m.decided_at, m.user_id, m.allowed DESC, m.message_id),
           array_agg(m.decided_at ORDER BY m.decided_at, m.user_id, m.allowed DESC, m.message_id),
           array_agg(m.allowed ORDER BY m.decided_at, m.user_id, m.allowed DESC, m.message_id),
           array_agg(m.reason ORDER BY m.decided_at, m.user_id, m.allowed DESC, m.message_id)
      INTO v_users, v_ids, v_tiers, v_topics, v_camps, v_at, v_allowed, v_reasons
      FROM gov.messages m
     WHERE m.decided_at > v_from AND m.decided_at <= v_now;
    v_n := coalesce(array_length(v_ids, 1), 0);
    IF v_n = 0 THEN
        RETURN;
    END IF;

    BEGIN
        -- the stand-ins start from each user's real history before the window: the send
        -- rows, and every allowed message in gov.messages spending the budgets the
        -- candidate has it spend (a decision writes rows only for budgets a cap reads, so
        -- a candidate capping a budget the live policy leaves uncapped, global say, still
        -- counts the sends before the window)
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v_tag || h.user_id, h.budget, h.sent_at, h.message_id
          FROM (SELECT s.user_id, s.budget, s.sent_at, s.message_id
                  FROM gov.sends s
                 WHERE s.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
                UNION
                SELECT m.user_id, b.budget, m.decided_at, m.message_id
                  FROM gov.messages m
                 CROSS JOIN LATERAL unnest(gov.budgets_of(gov.budget_map_v1(), m.tier, m.topic)) AS b(budget)
                 WHERE m.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
                   AND m.allowed
                   AND NOT EXISTS (SELECT 1 FROM gov.sends s
                                    WHERE s.user_id = m.user_id AND s.budget = b.budget
                                      AND s.message_id = m.message_id)) h
         WHERE h.sent_at <= v_from
           AND h.sent_at > v_from - (SELECT coalesce(max(w.window_ms), 0)
                                       FROM (SELECT c.window_ms FROM gov.caps c
                                             UNION ALL
                                             SELECT sc.window_ms FROM gov.segment_caps sc) w)
                                    * interval '1 millisecond';
        -- their own caps, where the policy has a default to lower (none, no effect)
        INSERT INTO gov.user_caps (user_id, scope, window_ms, cap)
        SELECT v_tag || uc.user_id, uc.scope, uc.window_ms,
               least(uc.cap, gov.user_cap_ceiling(uc.scope, uc.window_ms))
          FROM gov.user_caps uc
         WHERE uc.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
           AND gov.user_cap_ceiling(uc.scope, uc.window_ms) IS NOT NULL;
        -- and their time zone, quiet hours and segment
        INSERT INTO gov.users (user_id, time_zone, quiet_start, quiet_end, segment)
        SELECT v_tag || su.user_id, su.time_zone, su.quiet_start, su.quiet_end, su.segment
          FROM gov.users su
         WHERE su.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid));

        FOR i IN 1 .. v_n LOOP
            IF EXISTS (SELECT 1 FROM gov.tiers t WHERE t.tier = v_tiers[i]) THEN
                SELECT d.allowed, d.action, d.reason INTO v_verdict
                  FROM gov.decide_v1(v_tag || v_users[i], v_ids[i], v_tiers[i], v_topics[i], v_camps[i], v_at[i]) d;
                v_w_allow[i] := v_verdict.allowed;
                v_w_action[i] := v_verdict.action;
                v_w_reason[i] := v_verdict.reason;
            ELSE
                v_w_allow[i] := false;
                v_w_action[i] := 'refuse';
                v_w_reason[i] := 'unknown_tier';
            END IF;
        END LOOP;

        RAISE EXCEPTION 'whatif: undo the replay' USING ERRCODE = 'GV900';
    EXCEPTION WHEN SQLSTATE 'GV900' THEN
        NULL;  -- every write of the replay is rolled back here; the arrays keep the verdicts
    END;

    RETURN QUERY
    SELECT r.uid, r.mid, r.tier, r.topic, r.camp, r.at, r.was, r.was_reason, r.would, r.would_action, r.would_reason
      FROM unnest(v_users, v_ids, v_tiers, v_topics, v_camps, v_at, v_allowed, v_reasons,
                  v_w_allow, v_w_action, v_w_reason)
           AS r(uid, mid, tier, topic, camp, at, was, was_reason, would, would_action, would_reason);
END;
$$;
