-- Migration 0035 (issue 30, item 2): a campaign at each user's best hour
-- (gov.send_many_best_v1, `gov send-campaign --at best --within D`), and gov.best_slot
-- asked for by its caller whatever [timing] says, as in sql/schema/ at this revision. The
-- revision itself adds gov.message_content.timing, each DDL statement on its own (see
-- 0035_campaign_at_best.py).

DROP FUNCTION gov.best_slot(text, text, text, timestamptz, timestamptz, timestamptz);

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
CREATE FUNCTION gov.best_slot(
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
    v_set     record;
    v_zone    text;
    v_segment text;
    v_last    timestamptz;
    v_slots   timestamptz[];
    v_draw    bigint;
BEGIN
    o_slot := p_first;
    EXECUTE format('SELECT s.timing_enabled, s.timing_p1_max_delay_ms, s.timing_explore, s.jitter_ms FROM %s s',
                   gov.shard_relation('gov.settings', NULL)) INTO v_set;
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

-- A campaign delivered at each user's best hour (`gov send-campaign --at best --within D`).
-- Every user is decided now, exactly as gov.send_many_v2 decides them: the budget is spent
-- at p_now, so a second campaign or a race sees it at once and no slot is counted twice;
-- a retry of the message id returns its first verdict and slot. Each allowed user's
-- outbox rows then wait (next_attempt_at) for the best slot of their estimate within
-- p_within (gov.best_slot, asked for whatever [timing] says: quiet hours excluded, P0 at
-- once, P1 at most timing_p1_max_delay later, a share timing_explore at an hour drawn from
-- the message id), plus the user's jitter (gov.release_jitter), so one popular hour does
-- not fire all at once. The TTL counts from the slot. deliver_at: when the delivery is
-- due (NULL: not allowed); timing: 'best' or 'explore' (NULL: at once), also kept in
-- gov.message_content.timing. What is held (deferred, quiet hours, collapse) waits in
-- gov.deferred as any held message does. An endpoint subscribed after the decision does
-- not receive it, one retired before the slot is skipped by the runner.
CREATE FUNCTION gov.send_many_best_v1(
    p_shard_key    text,
    p_user_ids     text[],
    p_message_id   text,
    p_tier         text,
    p_topic        text,
    p_campaign_id  text,
    p_content      jsonb,
    p_collapse_key text,
    p_ttl_s        integer,
    p_within       interval,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    repeated       boolean,
    outbox_ids     bigint[],
    deliver_at     timestamptz,
    timing         text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    r_sent   record;
    v_slot   timestamptz;
    v_timing text;
    v_ttl_s  integer;
BEGIN
    IF p_within IS NULL OR p_within < interval '0' OR p_within > interval '7 days' THEN
        RAISE EXCEPTION 'gov.send_many_best_v1: p_within must be between 0 and 7 days, got %', p_within
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR r_sent IN
        SELECT * FROM gov.send_many_v2(p_shard_key, p_user_ids, p_message_id, p_tier, p_topic, p_campaign_id,
                                       p_content, p_collapse_key, p_ttl_s, v_now)
    LOOP
        v_slot := NULL;
        v_timing := NULL;
        IF r_sent.allowed AND NOT r_sent.repeated THEN
            SELECT b.o_slot, b.o_timing INTO v_slot, v_timing
              FROM gov.best_slot(r_sent.user_id, p_tier, p_message_id, v_now, v_now + p_within, v_now, true) b;
            IF v_slot > v_now THEN
                v_slot := v_slot + gov.release_jitter(r_sent.user_id, p_message_id);
                UPDATE gov.outbox o SET next_attempt_at = v_slot
                 WHERE o.user_id = r_sent.user_id AND o.id = ANY (r_sent.outbox_ids);
            ELSE
                v_slot := v_now;
            END IF;
            IF v_timing IS NOT NULL THEN
                -- the TTL from the slot, computed here: on a Citus cluster an UPDATE may not
                -- call a STABLE function (timestamptz + interval) on a column
                SELECT c.ttl_s INTO v_ttl_s
                  FROM gov.message_content c WHERE c.user_id = r_sent.user_id AND c.message_id = p_message_id;
                UPDATE gov.message_content c
                   SET expires_at = v_slot + v_ttl_s * interval '1 second', timing = v_timing
                 WHERE c.user_id = r_sent.user_id AND c.message_id = p_message_id;
            END IF;
        ELSIF r_sent.allowed THEN  -- a retry: the slot the first call chose
            SELECT c.expires_at, c.ttl_s, c.timing INTO v_slot, v_ttl_s, v_timing
              FROM gov.message_content c
             WHERE c.user_id = r_sent.user_id AND c.message_id = p_message_id;
            v_slot := v_slot - v_ttl_s * interval '1 second';
        END IF;
        user_id := r_sent.user_id;
        allowed := r_sent.allowed;
        action := r_sent.action;
        reason := r_sent.reason;
        repeated := r_sent.repeated;
        outbox_ids := r_sent.outbox_ids;
        deliver_at := v_slot;
        timing := v_timing;
        RETURN NEXT;
    END LOOP;
END;
$$;
