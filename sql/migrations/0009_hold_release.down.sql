-- Migration 0009 down: the hold/release rules of 0008, restored.

DROP FUNCTION gov.retire_tiers_v1(text[], boolean, timestamptz);
CREATE OR REPLACE FUNCTION gov.quiet_until(p_user_id text, p_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_tz    text;
    v_start time;
    v_end   time;
    v_local timestamp;
    v_open  timestamptz;
BEGIN
    SELECT u.time_zone, coalesce(u.quiet_start, s.quiet_start), coalesce(u.quiet_end, s.quiet_end)
      INTO v_tz, v_start, v_end
      FROM gov.users u
      LEFT JOIN gov.settings s ON true
     WHERE u.user_id = p_user_id AND u.time_zone IS NOT NULL;
    IF v_tz IS NULL OR v_start IS NULL THEN
        RETURN p_at;
    END IF;
    v_local := p_at AT TIME ZONE v_tz;
    IF v_start < v_end THEN
        IF NOT (v_local::time >= v_start AND v_local::time < v_end) THEN
            RETURN p_at;
        END IF;
    ELSIF NOT (v_local::time >= v_start OR v_local::time < v_end) THEN  -- the window spans midnight
        RETURN p_at;
    END IF;
    v_open := (v_local::date + v_end) AT TIME ZONE v_tz;
    IF v_open <= p_at THEN
        v_open := (v_local::date + 1 + v_end) AT TIME ZONE v_tz;
    END IF;
    RETURN v_open;
END;
$$;

CREATE OR REPLACE FUNCTION gov.hold(
    p_user_id      text,
    p_message_id   text,
    p_tier         text,
    p_collapse_key text,
    p_action       text,
    p_reason       text,
    p_retry_ms     bigint,
    p_expires_at   timestamptz,
    p_now          timestamptz,
    OUT o_action   text,
    OUT o_reason   text,
    OUT o_release  timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_kind    text;
    v_tier    gov.tiers%ROWTYPE;
    v_planned timestamptz;
    v_give_up timestamptz;
    v_group   gov.deferred%ROWTYPE;
BEGIN
    SELECT * INTO v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    v_kind := CASE WHEN p_reason = 'quiet_hours' THEN 'quiet' ELSE p_action END;
    IF v_kind NOT IN ('defer', 'quiet', 'collapse') OR (v_kind = 'collapse' AND p_collapse_key IS NULL)
       OR p_retry_ms IS NULL THEN
        o_action := 'drop';
        o_reason := p_reason;
        RETURN;
    END IF;

    -- The earliest moment that clears the blocking window and the user's quiet hours.
    v_planned := gov.quiet_until(p_user_id, p_now + p_retry_ms * interval '1 millisecond');
    IF v_kind = 'defer' THEN
        v_give_up := p_now + coalesce(v_tier.defer_max_ms, 21600000) * interval '1 millisecond';
        IF v_planned > v_give_up THEN
            o_action := 'drop';
            o_reason := 'defer_expired';
        END IF;
    END IF;
    IF o_reason IS NULL AND v_planned >= p_expires_at THEN
        o_action := 'drop';  -- it would be dead on arrival
        o_reason := 'ttl_expired';
    END IF;
    IF o_reason IS NOT NULL THEN
        INSERT INTO gov.deferred (user_id, message_id, tier, kind, collapse_key, blocked_by, enqueued_at,
                                  planned_at, release_at, give_up_at, state, outcome, finished_at)
        VALUES (p_user_id, p_message_id, p_tier, v_kind, p_collapse_key, p_reason, p_now,
                v_planned, v_planned, v_give_up, 'expired', o_reason, p_now);
        RETURN;
    END IF;

    IF v_kind = 'collapse' THEN
        -- join the group already waiting under this key: one release for all of them
        SELECT * INTO v_group FROM gov.deferred d
         WHERE d.user_id = p_user_id AND d.collapse_key = p_collapse_key AND d.state = 'waiting'
           AND d.kind = 'collapse'
         ORDER BY d.id LIMIT 1;
    END IF;
    o_action := v_kind;
    IF v_kind = 'quiet' THEN
        o_action := 'defer';
    END IF;
    o_reason := p_reason;
    o_release := coalesce(v_group.release_at, v_planned + gov.release_jitter(p_user_id, p_message_id));
    INSERT INTO gov.deferred (user_id, message_id, tier, kind, collapse_key, blocked_by, enqueued_at,
                              planned_at, release_at, give_up_at)
    VALUES (p_user_id, p_message_id, p_tier, v_kind, p_collapse_key, p_reason, p_now,
            v_planned, o_release, v_give_up);
END;
$$;

CREATE OR REPLACE FUNCTION gov.send_v1(
    p_user_id      text,
    p_message_id   text,
    p_tier         text,
    p_topic        text,
    p_campaign_id  text,
    p_content      jsonb,
    p_collapse_key text,
    p_ttl_s        integer,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean,
    outbox_ids     bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_verdict record;
    v_ttl_s   integer;
    v_ids     bigint[];
    v_held    record;
BEGIN
    SELECT * INTO v_verdict
      FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;

    IF v_verdict.repeated THEN
        RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                            v_verdict.cap, v_verdict.retry_after_ms, true, '{}'::bigint[];
        RETURN;
    END IF;

    SELECT coalesce(p_ttl_s, t.default_ttl_s) INTO v_ttl_s FROM gov.tiers t WHERE t.tier = p_tier;
    INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
    VALUES (p_user_id, p_message_id, p_content, p_collapse_key, v_ttl_s, v_now + v_ttl_s * interval '1 second');

    IF v_verdict.allowed THEN
        v_ids := gov.fan_out(p_user_id, p_message_id, v_now);
    ELSE
        SELECT * INTO v_held
          FROM gov.hold(p_user_id, p_message_id, p_tier, p_collapse_key, v_verdict.action, v_verdict.reason,
                        v_verdict.retry_after_ms, v_now + v_ttl_s * interval '1 second', v_now);
        IF v_held.o_action IS DISTINCT FROM v_verdict.action OR v_held.o_reason IS DISTINCT FROM v_verdict.reason THEN
            -- what really happens to it (a collapse without a key, or a wait too long, is a drop)
            UPDATE gov.messages m SET action = v_held.o_action, reason = v_held.o_reason
             WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
            UPDATE gov.push_suppressions ps SET action = v_held.o_action
             WHERE ps.user_id = p_user_id AND ps.message_id = p_message_id;
            v_verdict.action := v_held.o_action;
            v_verdict.reason := v_held.o_reason;
        END IF;
    END IF;

    RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                        v_verdict.cap, v_verdict.retry_after_ms, false, coalesce(v_ids, '{}'::bigint[]);
END;
$$;

CREATE OR REPLACE FUNCTION gov.release_due_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (user_id text, message_id text, state text, outcome text, outbox_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    r_due     record;
    v_row     gov.deferred%ROWTYPE;
    v_msg     gov.messages%ROWTYPE;
    v_mc      gov.message_content%ROWTYPE;
    v_verdict record;
    v_ids     bigint[];
    v_count   integer;
    v_next    timestamptz;
BEGIN
    FOR r_due IN
        SELECT d.id
          FROM gov.deferred d
         WHERE d.state = 'waiting' AND d.release_at <= v_now
         ORDER BY d.user_id, d.release_at, d.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    LOOP
        SELECT * INTO v_row FROM gov.deferred d WHERE d.id = r_due.id;
        CONTINUE WHEN v_row.state <> 'waiting';  -- collapsed into a summary earlier in this batch

        IF v_row.kind = 'collapse' THEN
            -- the group: lock every waiting row under the key; the newest speaks for all
            PERFORM 1 FROM gov.deferred d
              WHERE d.user_id = v_row.user_id AND d.collapse_key = v_row.collapse_key
                AND d.state = 'waiting' AND d.kind = 'collapse'
              FOR UPDATE;
            SELECT * INTO v_row FROM gov.deferred d
             WHERE d.user_id = v_row.user_id AND d.collapse_key = v_row.collapse_key
               AND d.state = 'waiting' AND d.kind = 'collapse'
             ORDER BY d.enqueued_at DESC, d.id DESC LIMIT 1;
        END IF;

        SELECT * INTO v_msg FROM gov.messages m WHERE m.user_id = v_row.user_id AND m.message_id = v_row.message_id;
        SELECT * INTO v_mc FROM gov.message_content c
         WHERE c.user_id = v_row.user_id AND c.message_id = v_row.message_id;

        IF v_mc.expires_at <= v_now THEN
            UPDATE gov.deferred d SET state = 'expired', outcome = 'ttl_expired', finished_at = v_now
             WHERE d.user_id = v_row.user_id AND d.state = 'waiting'
               AND (d.id = v_row.id OR (v_row.kind = 'collapse' AND d.kind = 'collapse'
                                        AND d.collapse_key = v_row.collapse_key));
            RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'expired'::text, 'ttl_expired'::text,
                                '{}'::bigint[];
            CONTINUE;
        END IF;

        SELECT * INTO v_verdict
          FROM gov.decide_core(v_row.user_id, v_row.message_id, v_msg.tier, v_msg.topic, v_msg.campaign_id,
                               v_now, true) d;

        IF v_verdict.allowed THEN
            v_ids := gov.fan_out(v_row.user_id, v_row.message_id, v_now);
            IF v_row.kind = 'collapse' THEN
                -- every held message of the group, the carrier too, is collapsed into the
                -- one summary, which goes out under the carrier's id with the count
                WITH c AS (
                    UPDATE gov.deferred d
                       SET state = 'collapsed', collapsed_into = v_row.message_id, finished_at = v_now,
                           outcome = CASE WHEN d.id = v_row.id THEN 'summary' ELSE 'collapsed' END
                     WHERE d.user_id = v_row.user_id AND d.collapse_key = v_row.collapse_key
                       AND d.state = 'waiting' AND d.kind = 'collapse'
                    RETURNING 1
                )
                SELECT count(*) INTO v_count FROM c;
                UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', v_count)
                 WHERE c.user_id = v_row.user_id AND c.message_id = v_row.message_id;
                RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'collapsed'::text, 'summary'::text, v_ids;
            ELSE
                UPDATE gov.deferred d SET state = 'released', outcome = 'released', finished_at = v_now
                 WHERE d.id = v_row.id;
                RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'released'::text, 'released'::text, v_ids;
            END IF;
            CONTINUE;
        END IF;

        -- Still blocked: wait again for the new window, unless that passes a limit.
        IF v_verdict.retry_after_ms IS NULL OR (v_row.kind = 'defer' AND v_verdict.action = 'drop') THEN
            v_next := NULL;
        ELSE
            v_next := gov.quiet_until(v_row.user_id, v_now + v_verdict.retry_after_ms * interval '1 millisecond');
        END IF;
        IF v_next IS NULL OR (v_row.kind <> 'collapse' AND v_verdict.action = 'drop') THEN
            UPDATE gov.deferred d SET state = 'dropped', outcome = v_verdict.reason, finished_at = v_now
             WHERE d.id = v_row.id;
            RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'dropped'::text, v_verdict.reason, '{}'::bigint[];
        ELSIF (v_row.give_up_at IS NOT NULL AND v_next > v_row.give_up_at) OR v_next >= v_mc.expires_at THEN
            UPDATE gov.deferred d
               SET state = 'expired', finished_at = v_now,
                   outcome = CASE WHEN v_next >= v_mc.expires_at THEN 'ttl_expired' ELSE 'defer_expired' END
             WHERE d.user_id = v_row.user_id AND d.state = 'waiting'
               AND (d.id = v_row.id OR (v_row.kind = 'collapse' AND d.kind = 'collapse'
                                        AND d.collapse_key = v_row.collapse_key));
            RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'expired'::text,
                                CASE WHEN v_next >= v_mc.expires_at THEN 'ttl_expired' ELSE 'defer_expired' END,
                                '{}'::bigint[];
        ELSE
            v_next := v_next + gov.release_jitter(v_row.user_id, v_row.message_id || '#' || v_now::text);
            UPDATE gov.deferred d SET release_at = v_next
             WHERE d.user_id = v_row.user_id AND d.state = 'waiting'
               AND (d.id = v_row.id OR (v_row.kind = 'collapse' AND d.kind = 'collapse'
                                        AND d.collapse_key = v_row.collapse_key));
            RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'waiting'::text, v_verdict.reason, '{}'::bigint[];
        END IF;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION gov.prune_sends_v1(p_batch integer, p_margin interval, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_longest bigint;
    v_count   integer;
BEGIN
    SELECT coalesce(max(c.window_ms), 0) INTO v_longest FROM gov.caps c;
    WITH doomed AS (
        SELECT s.ctid FROM gov.sends s
         WHERE s.sent_at < v_now - v_longest * interval '1 millisecond' - p_margin
         LIMIT p_batch
    )
    DELETE FROM gov.sends s USING doomed WHERE s.ctid = doomed.ctid;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

CREATE OR REPLACE FUNCTION gov.message_states_v1(p_since timestamptz, p_until timestamptz)
RETURNS TABLE (user_id text, message_id text, tier text, state text)
LANGUAGE sql STABLE AS $$
    WITH m AS (
        SELECT m.*, mc.user_id IS NOT NULL AS has_content,
               d.state AS held_state, d.outcome AS held_outcome, d.collapsed_into,
               (SELECT count(*) FROM gov.sends s
                 WHERE s.user_id = m.user_id AND s.message_id = m.message_id) AS spent,
               (SELECT array_agg(DISTINCT o.state) FROM gov.outbox o
                 WHERE o.user_id = m.user_id AND o.message_id = m.message_id) AS outbox_states,
               (SELECT count(*) FROM gov.push_suppressions ps
                 WHERE ps.user_id = m.user_id AND ps.message_id = m.message_id) AS suppressions,
               t.exempt
          FROM gov.messages m
          LEFT JOIN gov.message_content mc ON mc.user_id = m.user_id AND mc.message_id = m.message_id
          LEFT JOIN gov.deferred d ON d.user_id = m.user_id AND d.message_id = m.message_id
          LEFT JOIN gov.tiers t ON t.tier = m.tier
         WHERE m.decided_at >= p_since AND m.decided_at < p_until
            OR (d.enqueued_at >= p_since AND d.enqueued_at < p_until)
    )
    SELECT m.user_id, m.message_id, m.tier,
           CASE
             -- what must never be
             WHEN m.exempt AND (m.spent > 0 OR m.suppressions > 0 OR NOT m.allowed)
               THEN 'INCONSISTENT: P0 counted or suppressed'
             WHEN m.allowed AND NOT coalesce(m.exempt, false) AND m.spent = 0
               THEN 'INCONSISTENT: allowed without spending its budget'
             WHEN NOT m.allowed AND m.spent > 0
               THEN 'INCONSISTENT: suppressed but spent budget (a partial decision)'
             WHEN NOT m.allowed AND m.outbox_states IS NOT NULL
               THEN 'INCONSISTENT: suppressed but queued for delivery'
             WHEN NOT m.allowed AND m.held_state IN ('released')
               THEN 'INCONSISTENT: released but not allowed'
             WHEN m.allowed AND m.held_state = 'waiting'
               THEN 'INCONSISTENT: allowed and still held'
             WHEN NOT m.allowed AND m.has_content AND m.action IN ('defer', 'collapse') AND m.held_state IS NULL
               THEN 'INCONSISTENT: deferred but not in the queue (lost)'
             WHEN m.held_state = 'collapsed' AND m.collapsed_into IS NULL
               THEN 'INCONSISTENT: collapsed into no summary'
             -- the states
             WHEN m.held_state = 'waiting' THEN 'held'
             WHEN m.held_state = 'expired' THEN 'expired'
             WHEN m.held_state = 'dropped' THEN 'dropped'
             WHEN m.held_state = 'collapsed' AND m.held_outcome = 'collapsed' THEN 'collapsed'
             WHEN NOT m.allowed THEN 'dropped'
             WHEN NOT m.has_content THEN 'decided'
             WHEN m.outbox_states IS NULL THEN 'no_endpoint'
             WHEN m.outbox_states && ARRAY['pending', 'sending'] THEN 'in_flight'
             WHEN m.outbox_states && ARRAY['failed', 'expired'] THEN 'failed'
             ELSE 'delivered'
           END
      FROM m
$$;

CREATE OR REPLACE FUNCTION gov.health_v1(
    p_now         timestamptz DEFAULT NULL,
    p_stuck_after interval    DEFAULT '15 minutes'
) RETURNS TABLE (check_name text, ok boolean, detail text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    -- p0_suppressions: an exempt tier is never checked (invariant 4), so any suppression
    -- of one, ever, means a misclassified message or a broken policy.
    -- P0 through its partial index; another exempt tier (none by default) through a join
    -- from gov.tiers, which reads no suppression at all when there is none.
    RETURN QUERY
    SELECT 'p0_suppressions'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN 'no suppression of an exempt tier'
                ELSE format('%s suppression(s) of exempt tier(s) %s, latest message %s of user %s at %s',
                            count(*), string_agg(DISTINCT x.tier, ', '),
                            (array_agg(x.message_id ORDER BY x.created_at DESC, x.id DESC))[1],
                            (array_agg(x.user_id ORDER BY x.created_at DESC, x.id DESC))[1],
                            max(x.created_at))
           END
      FROM (SELECT ps.id, ps.user_id, ps.message_id, ps.tier, ps.created_at
              FROM gov.push_suppressions ps
             WHERE ps.tier = 'P0'
            UNION ALL
            SELECT ps.id, ps.user_id, ps.message_id, ps.tier, ps.created_at
              FROM gov.tiers t JOIN gov.push_suppressions ps ON ps.tier = t.tier
             WHERE t.exempt AND t.tier <> 'P0') x;

    -- outbox_stuck: a lease that ran out long ago and was never reclaimed means no
    -- runner (gov dispatch) is draining the outbox.
    RETURN QUERY
    SELECT 'outbox_stuck'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN format('no lease expired more than %s ago', p_stuck_after)
                ELSE format('%s outbox row(s) stuck in sending, oldest lease ran out at %s (row %s): is gov dispatch running?',
                            count(*), min(o.lease_until),
                            (array_agg(o.id ORDER BY o.lease_until, o.id))[1])
           END
      FROM gov.outbox o
     WHERE o.state = 'sending' AND o.lease_until < v_now - p_stuck_after;

    -- push_auth: a push service answering 401/403 in the last hour refuses our VAPID
    -- key or subject: every message to that origin fails until someone fixes it.
    RETURN QUERY
    SELECT 'push_auth'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN 'no 401/403 from a push service in the last hour'
                ELSE format('%s attempt(s) answered 401/403 in the last hour by %s: check the VAPID key and subject',
                            count(*), string_agg(DISTINCT da.origin, ', '))
           END
      FROM gov.delivery_attempts da
     WHERE da.status IN (401, 403)
       AND da.attempted_at > v_now - interval '1 hour' AND da.attempted_at <= v_now;

    -- deferred_overdue: held messages whose release time passed long ago mean no
    -- releaser (gov release, bin/gov-release from cron) is running.
    RETURN QUERY
    SELECT 'deferred_overdue'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN format('no held message overdue by more than %s', p_stuck_after)
                ELSE format('%s held message(s) overdue, oldest due at %s (user %s, message %s): is gov release running?',
                            count(*), min(d.release_at),
                            (array_agg(d.user_id ORDER BY d.release_at, d.id))[1],
                            (array_agg(d.message_id ORDER BY d.release_at, d.id))[1])
           END
      FROM gov.deferred d
     WHERE d.state = 'waiting' AND d.release_at < v_now - p_stuck_after;
END;
$$;

DROP FUNCTION gov.release_one(gov.deferred, timestamptz);
DROP FUNCTION gov.absorb_group(text, text, text, text, timestamptz);
DROP FUNCTION gov.local_instant(timestamp, text, timestamptz);

ALTER TABLE gov.settings DROP COLUMN pruned_before;

DROP INDEX gov.deferred_one_carrier;
CREATE INDEX deferred_collapse_group ON gov.deferred (user_id, collapse_key) WHERE state = 'waiting';

-- the old states know no 'failed': such a message was not sent, as a dropped one
UPDATE gov.deferred SET state = 'dropped', outcome = 'failed' WHERE state = 'failed';
ALTER TABLE gov.deferred
    DROP CONSTRAINT deferred_failed_says_why,
    DROP CONSTRAINT deferred_stands_for_positive,
    DROP CONSTRAINT deferred_state_known;
ALTER TABLE gov.deferred
    ADD CONSTRAINT deferred_state_known CHECK (state IN ('waiting', 'released', 'expired', 'collapsed', 'dropped'));
ALTER TABLE gov.deferred DROP COLUMN error, DROP COLUMN stands_for;
