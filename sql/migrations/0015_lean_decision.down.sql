-- Undo migration 0015: the decision assembles its rules on every call again and writes
-- every budget's row (budgets no cap read were not written meanwhile: the checks then
-- report those messages until their rows age out).

CREATE OR REPLACE FUNCTION gov.decide_core(
    p_user_id     text,
    p_message_id  text,
    p_tier        text,
    p_topic       text,
    p_campaign_id text,
    p_now         timestamptz,
    p_release     boolean
) RETURNS TABLE (
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_tier    gov.tiers%ROWTYPE;
    v_msg     gov.messages%ROWTYPE;
    r_rule    record;
    v_used    integer;
    v_cap     integer;
    v_rule    text;
    v_scope   text;
    v_action  text;
    v_free_at timestamptz;
    v_segment text;
    v_seg_key text;
BEGIN
    IF p_user_id IS NULL OR p_user_id = '' THEN
        RAISE EXCEPTION 'user_id is required' USING ERRCODE = 'GV001';
    END IF;
    IF p_message_id IS NULL OR p_message_id = '' THEN
        RAISE EXCEPTION 'message id is required (user %)', p_user_id USING ERRCODE = 'GV001';
    END IF;
    SELECT * INTO v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown tier % for message % (the policy defines: %)', p_tier, p_message_id,
            (SELECT string_agg(t.tier, ', ' ORDER BY t.tier) FROM gov.tiers t)
            USING ERRCODE = 'GV001';
    END IF;

    PERFORM pg_advisory_xact_lock(hashtextextended(p_user_id, 0));

    -- Idempotent on (user, message): a repeat returns the first verdict, spends nothing.
    IF NOT p_release THEN
        SELECT * INTO v_msg FROM gov.messages m
         WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
        IF FOUND THEN
            RETURN QUERY SELECT v_msg.allowed, v_msg.action, v_msg.reason, v_msg.used, v_msg.cap,
                                v_msg.retry_after_ms, true;
            RETURN;
        END IF;
    END IF;

    IF NOT v_tier.exempt THEN
        -- The user's segment, read under the user's lock: it chooses the windows of each
        -- consumed tier when the policy has that segment's (gov.segment_caps).
        SELECT u.segment INTO v_segment FROM gov.users u WHERE u.user_id = p_user_id;
        -- '' (no segment's name) for none: the rule query then has one shape for every
        -- user, and PostgreSQL keeps one cached plan for it instead of planning each call
        v_seg_key := coalesce(v_segment, '');
        -- A topic the user opted out of (the preference centre) is dropped, whatever
        -- the verb and the hour: holding it through the night would only drop it later.
        IF p_topic IS NOT NULL AND EXISTS (SELECT 1 FROM gov.user_topic_optouts o
                                            WHERE o.user_id = p_user_id AND o.topic = p_topic) THEN
            v_rule := 'topic_opt_out';
            v_scope := 'topic';
            v_action := 'drop';
            v_free_at := NULL;
        ELSE
            -- Quiet hours first: whatever the tier's verb, a message that arrives inside
            -- them waits until they end. P0 (exempt) is never quieted.
            v_free_at := gov.quiet_until(p_user_id, v_now);
        END IF;
        IF v_rule IS NOT NULL THEN
            NULL;  -- opted out: decided above
        ELSIF v_free_at > v_now THEN
            v_rule := 'quiet_hours';
            v_scope := 'quiet_hours';
            v_action := 'defer';
        ELSE
            -- Most specific first: topic, then the consumed tiers (own tier first, then
            -- downward), then global. A user's own cap replaces a default only when lower.
            -- A consumed tier's windows are the user's segment's when the policy gives
            -- that segment windows for the tier (gov.segment_caps), else the tier's own.
            -- A user's own cap over a window those segment windows lack still holds, on
            -- its own: segment windows never lift a user's own limit.
            FOR r_rule IN
                SELECT x.budget, x.window_ms, least(x.cap, uc.cap) AS cap, x.rule_name, x.scope
                  FROM (
                        SELECT 'topic:' || p_topic AS budget, c.window_ms, c.cap,
                               'topic_cap_' || c.window_ms || 'ms' AS rule_name, 'topic' AS scope,
                               1 AS ord1, 0 AS ord2
                          FROM gov.caps c
                         WHERE p_topic IS NOT NULL AND c.scope = 'topic'
                           AND c.topic = CASE WHEN EXISTS (SELECT 1 FROM gov.caps o
                                                            WHERE o.scope = 'topic' AND o.topic = p_topic)
                                              THEN p_topic ELSE '*' END
                        UNION ALL
                        SELECT tc.consumes, c.window_ms, c.cap,
                               'cap_' || c.window_ms || 'ms', tc.consumes,
                               2, CASE WHEN tc.consumes = p_tier THEN -100
                                       ELSE -substr(tc.consumes, 2)::int END
                          FROM gov.tier_consumes tc
                          JOIN gov.caps c ON c.scope = tc.consumes AND c.topic = ''
                         WHERE tc.tier = p_tier
                           AND NOT EXISTS (SELECT 1 FROM gov.segment_caps s
                                            WHERE s.tier = tc.consumes AND s.segment = v_seg_key)
                        UNION ALL
                        SELECT tc.consumes, sc.window_ms, sc.cap,
                               'cap_' || sc.window_ms || 'ms', tc.consumes,
                               2, CASE WHEN tc.consumes = p_tier THEN -100
                                       ELSE -substr(tc.consumes, 2)::int END
                          FROM gov.tier_consumes tc
                          JOIN gov.segment_caps sc ON sc.tier = tc.consumes AND sc.segment = v_seg_key
                         WHERE tc.tier = p_tier
                        UNION ALL
                        SELECT tc.consumes, uo.window_ms, uo.cap,
                               'cap_' || uo.window_ms || 'ms', tc.consumes,
                               2, CASE WHEN tc.consumes = p_tier THEN -100
                                       ELSE -substr(tc.consumes, 2)::int END
                          FROM gov.tier_consumes tc
                          JOIN gov.user_caps uo ON uo.user_id = p_user_id AND uo.scope = tc.consumes
                         WHERE tc.tier = p_tier
                           AND EXISTS (SELECT 1 FROM gov.segment_caps s
                                        WHERE s.tier = tc.consumes AND s.segment = v_seg_key)
                           AND NOT EXISTS (SELECT 1 FROM gov.segment_caps s
                                            WHERE s.tier = tc.consumes AND s.segment = v_seg_key
                                              AND s.window_ms = uo.window_ms)
                           -- only a cap with a default to lower, as the guard admits
                           AND gov.user_cap_ceiling(uo.scope, uo.window_ms) IS NOT NULL
                        UNION ALL
                        SELECT 'global', c.window_ms, c.cap,
                               'global_cap_' || c.window_ms || 'ms', 'global', 3, 0
                          FROM gov.caps c
                         WHERE c.scope = 'global'
                       ) x
                  LEFT JOIN gov.user_caps uc
                         ON uc.user_id = p_user_id AND uc.scope = x.scope AND uc.window_ms = x.window_ms
                 ORDER BY x.ord1, x.ord2, x.window_ms
            LOOP
                SELECT count(*) INTO v_used
                  FROM gov.sends s
                 WHERE s.user_id = p_user_id AND s.budget = r_rule.budget
                   AND s.sent_at > v_now - r_rule.window_ms * interval '1 millisecond';
                CONTINUE WHEN v_used < r_rule.cap;

                -- Blocked. A slot frees when enough of the oldest rows leave the window
                -- for the count to drop below the cap (more than one when a cap was lowered).
                SELECT s.sent_at + r_rule.window_ms * interval '1 millisecond' INTO v_free_at
                  FROM gov.sends s
                 WHERE s.user_id = p_user_id AND s.budget = r_rule.budget
                   AND s.sent_at > v_now - r_rule.window_ms * interval '1 millisecond'
                 ORDER BY s.sent_at
                OFFSET v_used - r_rule.cap LIMIT 1;
                IF r_rule.cap = 0 THEN
                    v_free_at := NULL;  -- a cap of 0 never frees a slot
                END IF;
                v_rule := r_rule.rule_name;
                v_scope := r_rule.scope;
                v_cap := r_rule.cap;
                v_action := v_tier.on_exceed;
                EXIT;
            END LOOP;
        END IF;

        IF v_rule IS NOT NULL THEN
            v_msg.retry_after_ms := CASE WHEN v_free_at IS NOT NULL
                                         THEN greatest(0, ceil(extract(epoch FROM v_free_at - v_now) * 1000))::bigint
                                    END;
            IF p_release THEN
                UPDATE gov.messages m
                   SET allowed = false, action = v_action, reason = v_rule, used = v_used, cap = v_cap,
                       retry_after_ms = v_msg.retry_after_ms, decided_at = v_now
                 WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
            ELSE
                INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                          reason, used, cap, retry_after_ms, decided_at)
                VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, false, v_action,
                        v_rule, v_used, v_cap, v_msg.retry_after_ms, v_now);
                INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                                   campaign_id, topic, blocked_scope, used, cap,
                                                   retry_after_ms, created_at, segment)
                VALUES (p_user_id, p_message_id, p_tier, v_rule, v_action, p_campaign_id, p_topic,
                        v_scope, v_used, v_cap, v_msg.retry_after_ms, v_now, v_segment);
            END IF;
            RETURN QUERY SELECT false, v_action, v_rule, v_used, v_cap, v_msg.retry_after_ms, false;
            RETURN;
        END IF;

        -- Every rule passed: spend one slot in each budget.
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT p_user_id, tc.consumes, v_now, p_message_id
          FROM gov.tier_consumes tc WHERE tc.tier = p_tier
        UNION ALL
        SELECT p_user_id, 'topic:' || p_topic, v_now, p_message_id WHERE p_topic IS NOT NULL
        UNION ALL
        SELECT p_user_id, 'global', v_now, p_message_id;
    END IF;

    IF p_release THEN
        UPDATE gov.messages m
           SET allowed = true, action = NULL, reason = NULL, used = NULL, cap = NULL,
               retry_after_ms = NULL, decided_at = v_now
         WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
    ELSE
        INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, decided_at)
        VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, true, v_now);
    END IF;

    RETURN QUERY SELECT true, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint, false;
END;
$$;

CREATE OR REPLACE FUNCTION gov.whatif_v1(
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
    SELECT array_agg(m.user_id ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.message_id ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.tier ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.topic ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.campaign_id ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.decided_at ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.allowed ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.reason ORDER BY m.decided_at, m.user_id, m.message_id)
      INTO v_users, v_ids, v_tiers, v_topics, v_camps, v_at, v_allowed, v_reasons
      FROM gov.messages m
     WHERE m.decided_at > v_from AND m.decided_at <= v_now;
    v_n := coalesce(array_length(v_ids, 1), 0);
    IF v_n = 0 THEN
        RETURN;
    END IF;

    BEGIN
        -- the stand-ins start from each user's real history before the window
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v_tag || s.user_id, s.budget, s.sent_at, s.message_id
          FROM gov.sends s
         WHERE s.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
           AND s.sent_at <= v_from
           AND s.sent_at > v_from - (SELECT coalesce(max(w.window_ms), 0)
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
                  AND m.decided_at >= coalesce((SELECT s.pruned_before FROM gov.settings s), '-infinity')
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
             WHEN m.held_state = 'failed' THEN 'failed'
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

DROP FUNCTION gov.backfill_sends_v1(text[], timestamptz);
DROP FUNCTION gov.capped_budgets();
DROP FUNCTION gov.spent_budgets(text, text);
DROP FUNCTION gov.compile_policy_v1();
DROP TABLE gov.compiled_rules;
