-- Migration 0053: the best hours from reach (issue 30). The click rate by hour of display
-- (gov.best_hours_v1) is biased twice over in the data gov has (docs/analysts.md): what is
-- displayed at an hour depends on what was sent then, and a display at an hour comes from
-- the browsers open then. gov.reach_hours counts instead, by local hour of DELIVERY,
-- whether the browser displayed the message at once; gov.hour_curves_v2,
-- gov.user_reach_estimates (internal) and gov.best_hours_v2 smooth and shrink it. The
-- timing of held messages (gov.best_slot, gov.refresh_timing_curves_v1, same signatures)
-- reads the reach from now on. The v1 functions and the view gov.hour_curve stay as they
-- were. As in sql/schema/ at this revision.

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
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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

-- Copy the population's and each segment's reach by local hour (gov.hour_curves_v2, with
-- its defaults) into gov.timing_curves, the prior gov.best_slot reads at every hold. Run
-- it about once a day (cron: psql -c 'SELECT gov.refresh_timing_curves_v1()'): the
-- curves move slowly, and a hold must not scan every user's events. Returns the rows
-- written (24 per curve; none while nothing was delivered in the window). Migration 0053
-- moved it from the click rate by hour of display (gov.hour_curves_v1) to the reach:
-- docs/analysts.md, "The best hours, from reach".
CREATE OR REPLACE FUNCTION gov.refresh_timing_curves_v1(p_since interval DEFAULT '56 days', p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    v_rows integer;
BEGIN
    DELETE FROM gov.timing_curves;
    INSERT INTO gov.timing_curves (segment, hour, estimate, refreshed_at)
    SELECT coalesce(c.segment, ''), c.hour, c.estimate, v_now
      FROM gov.hour_curves_v2(p_since, v_now) c
     WHERE c.estimate IS NOT NULL;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END;
$$;

-- The slot a held message is planned for (docs/analysts.md, "Timing"). p_first: the first
-- moment that passes every cap and quiet hours (a window freed then stays free until
-- another send takes it, and the release decides again in any case). [timing] off, or no
-- curve yet: p_first itself (o_timing NULL). On: the candidates are p_first and every
-- whole local hour after it that is not quiet, up to the deadline (p_deadline less the
-- jitter and a minute, so the jittered release still comes before it; for P1 also at most
-- the policy's timing_p1_max_delay past p_first); the slot is the candidate whose local
-- hour has the highest reach estimate of the user (their own deliveries of 56 days and
-- those displayed at once, smoothed over the neighbouring hours and shrunk toward their
-- segment's curve, else all users', gov.timing_curves, as gov.best_hours_v2 does with
-- its defaults), the earliest on a tie (o_timing 'best'). A share
-- timing_explore of the messages, drawn from p_seed (the message id: a retry draws the
-- same), goes at a candidate drawn from it instead (o_timing 'explore'), so the estimate
-- sees hours the timing would not choose. p_asked: the caller asked for the best slot
-- whatever [timing] says (a campaign sent with --at best, gov.send_many_best_v1).
CREATE OR REPLACE FUNCTION gov.best_slot(
    p_user_id  text,
    p_tier     text,
    p_seed     text,
    p_first    timestamptz,
    p_deadline timestamptz,
    p_now      timestamptz,
    p_asked    boolean DEFAULT false,
    OUT o_slot   timestamptz,
    OUT o_timing text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_set     gov.settings;
    v_zone    text;
    v_segment text;
    v_last    timestamptz;
    v_slots   timestamptz[];
    v_draw    bigint;
BEGIN
    o_slot := p_first;
    v_set := gov.current_settings();
    IF (v_set.timing_enabled IS NOT TRUE AND NOT p_asked) OR p_tier = 'P0' THEN
        RETURN;
    END IF;
    v_last := p_deadline - (v_set.jitter_ms + 60000) * interval '1 millisecond';
    IF p_tier = 'P1' THEN
        v_last := least(v_last, p_first + v_set.timing_p1_max_delay_ms * interval '1 millisecond');
    END IF;
    IF v_last <= p_first THEN
        RETURN;
    END IF;
    SELECT u.time_zone, u.segment INTO v_zone, v_segment FROM gov.users u WHERE u.user_id = p_user_id;
    v_zone := coalesce(v_zone, 'UTC');
    -- the candidates, in time order: p_first, then each local hour's start, not quiet
    v_slots := ARRAY(
        SELECT c.t FROM (
            SELECT p_first AS t
            UNION
            SELECT ((date_trunc('hour', p_first AT TIME ZONE v_zone) + k * interval '1 hour') AT TIME ZONE v_zone)
              FROM generate_series(1, (extract(epoch FROM v_last - p_first) / 3600)::integer + 2) k
        ) c
         WHERE c.t >= p_first AND c.t <= v_last AND gov.quiet_until(p_user_id, c.t) = c.t
         ORDER BY c.t);
    IF cardinality(v_slots) <= 1 THEN
        RETURN;
    END IF;
    v_draw := abs(hashtextextended(p_seed, 30));
    IF (v_draw % 1000000) < v_set.timing_explore * 1000000 THEN
        o_slot := v_slots[1 + (v_draw / 1000000) % cardinality(v_slots)];
        o_timing := 'explore';
        RETURN;
    END IF;
    SELECT s.t INTO o_slot
      FROM unnest(v_slots) s(t)
      JOIN (SELECT p.hour,
                   (coalesce(o.k, 0) + 2 * coalesce(g.estimate, p.estimate)) / (coalesce(o.n, 0) + 2) AS est
              FROM gov.timing_curves p
              LEFT JOIN gov.timing_curves g ON g.segment = v_segment AND g.hour = p.hour
              LEFT JOIN (SELECT (r.hour + w.shift + 24) % 24 AS hour,
                                sum(w.weight * r.deliveries) AS n, sum(w.weight * r.prompt) AS k
                           FROM gov.reach_hours('56 days', p_now, '5 minutes', p_user_id) r
                          CROSS JOIN (VALUES (-1, 0.25::double precision), (0, 0.5::double precision),
                                             (1, 0.25::double precision)) w(shift, weight)
                          GROUP BY 1) o ON o.hour = p.hour
             WHERE p.segment = '') e ON e.hour = date_part('hour', s.t AT TIME ZONE v_zone)
     ORDER BY e.est DESC, s.t
     LIMIT 1;
    IF o_slot IS NULL THEN  -- no curve yet: the first slot
        o_slot := p_first;
        RETURN;
    END IF;
    o_timing := 'best';
END;
$$;

-- The timing's prior held click rates (gov.hour_curves_v1): written again as reach, so that
-- no hold blends a user's reach with a click-rate prior. Nothing when it was never refreshed.
SELECT gov.refresh_timing_curves_v1() WHERE EXISTS (SELECT 1 FROM gov.timing_curves);
