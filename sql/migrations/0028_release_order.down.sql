-- Undo migration 0028: the release order by release_at, as migration 0016 made it.

CREATE OR REPLACE FUNCTION gov.release_one(
    p_row        gov.deferred,
    p_now        timestamptz,
    OUT o_state      text,
    OUT o_outcome    text,
    OUT o_outbox_ids bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_msg     gov.messages%ROWTYPE;
    v_mc      gov.message_content%ROWTYPE;
    v_verdict record;
    v_next    timestamptz;
BEGIN
    o_outbox_ids := '{}';
    SELECT * INTO v_msg FROM gov.messages m WHERE m.user_id = p_row.user_id AND m.message_id = p_row.message_id;
    SELECT * INTO v_mc FROM gov.message_content c WHERE c.user_id = p_row.user_id AND c.message_id = p_row.message_id;
    IF v_msg.user_id IS NULL OR v_mc.user_id IS NULL THEN
        RAISE EXCEPTION 'held message % of user % has no decision or no content', p_row.message_id, p_row.user_id;
    END IF;

    IF v_mc.expires_at <= p_now THEN
        o_state := 'expired';
        o_outcome := 'ttl_expired';
    ELSE
        SELECT * INTO v_verdict
          FROM gov.decide_core(p_row.user_id, p_row.message_id, v_msg.tier, v_msg.topic, v_msg.campaign_id,
                               p_now, true) d;
        IF v_verdict.allowed THEN
            o_outbox_ids := gov.fan_out(p_row.user_id, p_row.message_id, p_now);
            IF p_row.stands_for > 1 THEN
                UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', p_row.stands_for)
                 WHERE c.user_id = p_row.user_id AND c.message_id = p_row.message_id;
                o_state := 'collapsed';
                o_outcome := 'summary';
            ELSE
                o_state := 'released';
                o_outcome := 'released';
            END IF;
            UPDATE gov.deferred d
               SET state = o_state, outcome = o_outcome, finished_at = p_now,
                   collapsed_into = CASE WHEN o_state = 'collapsed' THEN p_row.message_id END
             WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
            RETURN;
        END IF;

        IF v_verdict.action = 'drop' OR v_verdict.retry_after_ms IS NULL THEN
            o_state := 'dropped';
            o_outcome := v_verdict.reason;
        ELSE
            v_next := gov.quiet_until(p_row.user_id, p_now + v_verdict.retry_after_ms * interval '1 millisecond');
            IF p_row.give_up_at IS NOT NULL AND v_next > p_row.give_up_at THEN
                o_state := 'expired';
                o_outcome := 'defer_expired';
            ELSIF v_next >= v_mc.expires_at THEN
                o_state := 'expired';
                o_outcome := 'ttl_expired';
            ELSE
                -- never due again in the same instant: every round moves a row forward
                v_next := greatest(v_next + gov.release_jitter(p_row.user_id, p_row.message_id || '#' || v_next::text),
                                   p_now + interval '1 millisecond');
                UPDATE gov.deferred d SET release_at = v_next
                 WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
                o_state := 'waiting';
                o_outcome := v_verdict.reason;
                RETURN;
            END IF;
        END IF;
    END IF;

    UPDATE gov.deferred d SET state = o_state, outcome = o_outcome, finished_at = p_now
     WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
    UPDATE gov.deferred d SET state = o_state, outcome = o_outcome, finished_at = p_now
     WHERE d.user_id = p_row.user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
       AND d.collapsed_into = p_row.message_id;
END;
$$;

CREATE OR REPLACE FUNCTION gov.release_due_v2(p_shard_key text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (user_id text, message_id text, state text, outcome text, outbox_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    r_due     gov.deferred%ROWTYPE;
    v_done    record;
    v_error   text;
    v_handled integer := 0;
BEGIN
    -- No LIMIT in the query: a busy row must not take the place of one that can go, so
    -- the loop counts what it handled and stops at p_limit (rows are locked as fetched).
    FOR r_due IN EXECUTE format($q$
        SELECT d.*
          FROM %s d
         WHERE d.state = 'waiting' AND d.release_at <= $1
         ORDER BY d.release_at, d.id
           FOR UPDATE SKIP LOCKED
        $q$, gov.shard_relation('gov.deferred', p_shard_key)) USING v_now
    LOOP
        EXIT WHEN v_handled >= p_limit;
        IF NOT pg_try_advisory_xact_lock(hashtextextended(r_due.user_id, 0)) THEN
            RETURN QUERY SELECT r_due.user_id, r_due.message_id, 'busy'::text, NULL::text, '{}'::bigint[];
            CONTINUE;
        END IF;
        v_handled := v_handled + 1;
        BEGIN
            SELECT * INTO v_done FROM gov.release_one(r_due, v_now) r;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_error = MESSAGE_TEXT;
            v_error := left(v_error, 1000);
            UPDATE gov.deferred d SET state = 'failed', outcome = 'failed', error = v_error, finished_at = v_now
             WHERE d.user_id = r_due.user_id AND d.id = r_due.id;
            UPDATE gov.deferred d
               SET state = 'failed', outcome = 'failed', finished_at = v_now,
                   error = format('collapsed into %s, which failed: %s', r_due.message_id, v_error)
             WHERE d.user_id = r_due.user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
               AND d.collapsed_into = r_due.message_id;
            SELECT 'failed'::text AS o_state, 'failed'::text AS o_outcome, '{}'::bigint[] AS o_outbox_ids
              INTO v_done;
        END;
        RETURN QUERY SELECT r_due.user_id, r_due.message_id, v_done.o_state, v_done.o_outcome, v_done.o_outbox_ids;
    END LOOP;
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
    v_verb    text;
    v_ids     bigint[];
    v_held    record;
BEGIN
    -- A TTL of 0 ("now or never") would be past its deadline before any runner could
    -- send it: refused, rather than allowed, counted and never delivered.
    IF p_ttl_s IS NOT NULL AND p_ttl_s < 1 THEN
        RAISE EXCEPTION 'ttl must be at least 1 second (message % of user %, ttl %)', p_message_id, p_user_id, p_ttl_s
            USING ERRCODE = 'GV001';
    END IF;
    SELECT * INTO v_verdict
      FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;

    IF v_verdict.repeated THEN
        RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                            v_verdict.cap, v_verdict.retry_after_ms, true, '{}'::bigint[];
        RETURN;
    END IF;

    SELECT coalesce(p_ttl_s, t.default_ttl_s), t.on_exceed INTO v_ttl_s, v_verb FROM gov.tiers t WHERE t.tier = p_tier;
    INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
    VALUES (p_user_id, p_message_id, p_content, p_collapse_key, v_ttl_s, v_now + v_ttl_s * interval '1 second');

    IF v_verdict.allowed THEN
        IF v_verb = 'collapse' THEN  -- only a collapse tier has groups: no probe for the others
            PERFORM gov.absorb_group(p_user_id, p_message_id, p_tier, p_collapse_key, v_now);
        END IF;
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

DROP FUNCTION gov.release_owed(text, text, text, timestamptz, timestamptz);
DROP FUNCTION gov.release_contenders(text, text, text, timestamptz);
DROP FUNCTION gov.release_row(gov.deferred, timestamptz);
-- the index is dropped by the revision itself, in a statement of its own (see 0028_release_order.py)
