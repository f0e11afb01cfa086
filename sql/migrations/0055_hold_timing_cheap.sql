-- Migration 0055: a hold with timing on costs what it should. gov.best_slot asked
-- gov.quiet_until of every candidate hour up to the deadline (about 105 calls a hold in
-- gov simulate with timing on, 2 ms of its 3.5) before ordering them by the estimate; it now
-- asks in the estimate's order and stops at the first that is not quiet (the same slot:
-- the first non-quiet candidate in (estimate desc, time) order), and counts the non-quiet
-- candidates only up to two. gov.reach_hours and gov.display_hours are planned for each
-- call's arguments: a generic plan of "p_user_id IS NULL OR e.user_id = p_user_id" read
-- every user's events of 56 days for one user's hold (1.3 ms a call on a small run, and
-- growing with the table). Signatures unchanged. As in sql/schema/ at this revision.

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
    v_cands   timestamptz[];
    v_slots   timestamptz[];
    v_t       timestamptz;
    v_open    integer := 0;
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
    -- the candidates, in time order: p_first, then each local hour's start. Whether one is
    -- quiet (gov.quiet_until, about 20 us a call) is asked only as far as the answer needs
    -- (migration 0055): a week's deadline has 168 candidates, and the best is nearly
    -- always among the first few asked.
    v_cands := ARRAY(
        SELECT c.t FROM (
            SELECT p_first AS t
            UNION
            SELECT ((date_trunc('hour', p_first AT TIME ZONE v_zone) + k * interval '1 hour') AT TIME ZONE v_zone)
              FROM generate_series(1, (extract(epoch FROM v_last - p_first) / 3600)::integer + 2) k
        ) c
         WHERE c.t >= p_first AND c.t <= v_last
         ORDER BY c.t);
    -- at most one candidate that is not quiet: nothing to choose
    FOREACH v_t IN ARRAY v_cands LOOP
        IF gov.quiet_until(p_user_id, v_t) = v_t THEN
            v_open := v_open + 1;
            EXIT WHEN v_open > 1;
        END IF;
    END LOOP;
    IF v_open <= 1 THEN
        RETURN;
    END IF;
    v_draw := abs(hashtextextended(p_seed, 30));
    IF (v_draw % 1000000) < v_set.timing_explore * 1000000 THEN
        v_slots := ARRAY(SELECT c.t FROM unnest(v_cands) c(t) WHERE gov.quiet_until(p_user_id, c.t) = c.t ORDER BY c.t);
        o_slot := v_slots[1 + (v_draw / 1000000) % cardinality(v_slots)];
        o_timing := 'explore';
        RETURN;
    END IF;
    -- the best estimate first (the earliest on a tie): the first of them that is not quiet
    FOR v_t IN
        SELECT s.t
          FROM unnest(v_cands) s(t)
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
    LOOP
        IF gov.quiet_until(p_user_id, v_t) = v_t THEN
            o_slot := v_t;
            o_timing := 'best';
            RETURN;
        END IF;
    END LOOP;
    -- no curve yet: the first slot
END;
$$;

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
CREATE OR REPLACE FUNCTION gov.display_hours(
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
CREATE OR REPLACE FUNCTION gov.reach_hours(
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
