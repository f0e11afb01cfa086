-- Migration 0029: the best hours (issue 30, item 1): gov.display_hours (internal),
-- gov.hour_curves_v1, gov.user_hour_estimates (internal), gov.best_hours_v1 and the view
-- gov.hour_curve, as in
-- sql/schema/50_analytics.sql at this revision.

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
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    IF p_strength IS NULL OR NOT p_strength > 0 THEN
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

-- All users' click rate by local hour of day over the last 56 days (segment NULL), and
-- each segment's; call gov.hour_curves_v1 for another window or prior strength.
CREATE VIEW gov.hour_curve AS
SELECT c.segment, c.hour, c.displays, c.clicks, c.click_rate, c.estimate
  FROM gov.hour_curves_v1() c;
