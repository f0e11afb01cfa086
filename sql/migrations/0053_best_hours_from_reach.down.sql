-- Undo migration 0053: the timing reads the click rate by hour of display again (as at
-- 0052), and the reach functions go.
-- Copy the population's and each segment's curve (gov.hour_curves_v1: the click rate by
-- local hour of day, shrunk) into gov.timing_curves, the prior gov.best_slot reads at every
-- hold. Run it about once a day (cron: psql -c 'SELECT gov.refresh_timing_curves_v1()'):
-- the curves move slowly, and a hold must not scan every user's events. Returns the
-- rows written (24 per curve; none while nobody displayed anything in the window).
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
      FROM gov.hour_curves_v1(p_since, v_now) c
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
-- hour has the highest estimate of the user (their own displays and clicks of 56 days,
-- shrunk toward their segment's curve, else all users', gov.timing_curves, as
-- gov.best_hours_v1 does), the earliest on a tie (o_timing 'best'). A share
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
                   (coalesce(o.clicks, 0) + 20 * coalesce(g.estimate, p.estimate)) / (coalesce(o.displays, 0) + 20) AS est
              FROM gov.timing_curves p
              LEFT JOIN gov.timing_curves g ON g.segment = v_segment AND g.hour = p.hour
              LEFT JOIN gov.display_hours('56 days', p_now, p_user_id) o ON o.hour = p.hour
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

-- the prior as click rates again, as 0052's timing reads it
SELECT gov.refresh_timing_curves_v1() WHERE EXISTS (SELECT 1 FROM gov.timing_curves);

DROP FUNCTION gov.best_hours_v2(text, interval, timestamptz, double precision, interval);
DROP FUNCTION gov.user_reach_estimates(interval, timestamptz, double precision, interval, text);
DROP FUNCTION gov.hour_curves_v2(interval, timestamptz, double precision, interval);
DROP FUNCTION gov.check_reach_args(double precision, interval);
DROP FUNCTION gov.reach_hours(interval, timestamptz, interval, text);
