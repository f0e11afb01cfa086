-- Migration 0014: the marginal fatigue measure. gov.fatigue_marginal_v1 reports, per send
-- position in the user's trailing week, overall and per segment (gov.users.segment, read
-- through the new view gov.user_segments), the click and unsubscribe rate per send with
-- 95 % Wilson intervals, and the crossover.

-- Which segment each user is in, for analysts (gov.users holds private settings too: time
-- zone, quiet hours). Users without a segment are left out.
CREATE VIEW gov.user_segments AS
SELECT u.user_id, u.segment FROM gov.users u WHERE u.segment IS NOT NULL;

-- The 95 % Wilson score interval of a proportion: p_successes out of p_trials (NULLs
-- when p_trials is 0; counts may be fractional, for projections). Good near 0 and with
-- few trials, where the normal interval is not. Another p_z, another confidence.
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
      FROM (SELECT p_successes / p_trials AS p, p_trials AS n, p_z * p_z AS z2
             WHERE p_trials > 0) x
$$;

-- The lower confidence bound of (p_unsubscribes - p_clicks) / p_sends, the unsubscribe rate
-- minus the click rate of the same sends: Newcombe's hybrid score interval, from the Wilson
-- bounds of the two rates at p_z. Above 0: the unsubscribe rate is the higher one.
CREATE FUNCTION gov.difference_low_v1(
    p_unsubscribes double precision,
    p_clicks       double precision,
    p_sends        double precision,
    p_z            double precision DEFAULT 1.959963984540054
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_unsubscribes - p_clicks) / p_sends
           - sqrt((p_unsubscribes / p_sends - u.low) ^ 2 + (c.high - p_clicks / p_sends) ^ 2)
      FROM gov.wilson_interval_v1(p_unsubscribes, p_sends, p_z) u,
           gov.wilson_interval_v1(p_clicks, p_sends, p_z) c
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
    IF p_sends IS NULL OR p_sends <= 0 OR p_unsubscribes <= p_clicks THEN
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
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE bounds AS (
        SELECT b.t_end - p_since AS t_start, b.t_end
          FROM (SELECT coalesce(p_now, clock_timestamp()) AS t_end) b
    ),
    accepted AS (
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
    left_at AS (
        SELECT DISTINCT ON (e.user_id) e.user_id, e.message_id, e.created_at AS at
          FROM gov.push_events e CROSS JOIN bounds w
         WHERE e.event = 'unsubscribe' AND e.created_at <= w.t_end
         ORDER BY e.user_id, e.created_at, e.id
    ),
    charged AS (
        SELECT l.user_id,
               coalesce((SELECT n.rn FROM numbered n
                          WHERE n.user_id = l.user_id AND n.message_id = l.message_id AND n.at <= l.at),
                        (SELECT max(n.rn) FROM numbered n WHERE n.user_id = l.user_id AND n.at <= l.at),
                        0) AS rn
          FROM left_at l
    ),
    counted AS (
        SELECT coalesce(u.segment, '(none)') AS segment,
               (n.rn - 1 - n.aged)::integer AS position,
               EXISTS (SELECT 1 FROM gov.push_events x
                        WHERE x.user_id = n.user_id AND x.message_id = n.message_id
                          AND x.event = 'click' AND x.created_at <= w.t_end) AS clicked,
               coalesce(n.rn = c.rn, false) AS unsubscribed
          FROM numbered n CROSS JOIN bounds w
          LEFT JOIN charged c ON c.user_id = n.user_id
          LEFT JOIN gov.user_segments u ON u.user_id = n.user_id
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
$$;
