-- Undo 0004: back to the decision and send of 0001/0002.
DROP FUNCTION gov.release_due_v1(integer, timestamptz);
DROP FUNCTION gov.send_v1(text, text, text, text, text, jsonb, text, integer, timestamptz);
DROP FUNCTION gov.hold(text, text, text, text, text, text, bigint, timestamptz, timestamptz);
DROP FUNCTION gov.fan_out(text, text, timestamptz);
DROP FUNCTION gov.decide_v1(text, text, text, text, text, timestamptz);
DROP FUNCTION gov.decide_core(text, text, text, text, text, timestamptz, boolean);
DROP FUNCTION gov.release_jitter(text, text);
DROP FUNCTION gov.quiet_until(text, timestamptz);
DROP TABLE gov.deferred;

-- The decision. One call per message, atomic: every window of every consumed tier,
-- the topic cap and the global cap pass and one gov.sends row per spent budget is
-- written; or nothing is spent and one push_suppressions row says why.
--
-- Lock choice: a transaction-scoped advisory lock on a 64-bit hash of the user id
-- (hashtextextended; hashtext() collides, WEBPUSH.md). Measured against a row lock
-- on a per-user row (INSERT … ON CONFLICT, SELECT … FOR UPDATE) with
-- bench/lock_choice.sql (docs/performance.md): see the figures there. The advisory
-- lock needs no row to exist, writes no tuple (a row lock on a hot user dirties its
-- row on every decision), and is released by commit or rollback like a row lock.
CREATE FUNCTION gov.decide_v1(
    p_user_id     text,
    p_message_id  text,
    p_tier        text,
    p_topic       text        DEFAULT NULL,
    p_campaign_id text        DEFAULT NULL,
    p_now         timestamptz DEFAULT NULL
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
    v_free_at timestamptz;
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
    SELECT * INTO v_msg FROM gov.messages m
     WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
    IF FOUND THEN
        RETURN QUERY SELECT v_msg.allowed, v_msg.action, v_msg.reason, v_msg.used, v_msg.cap,
                            v_msg.retry_after_ms, true;
        RETURN;
    END IF;

    IF NOT v_tier.exempt THEN
        -- Most specific first: topic, then the consumed tiers (own tier first, then
        -- downward), then global. A user's own cap replaces a default only when lower.
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

            INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                      reason, used, cap, retry_after_ms, decided_at)
            VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, false, v_tier.on_exceed,
                    r_rule.rule_name, v_used, r_rule.cap,
                    CASE WHEN r_rule.cap > 0
                         THEN greatest(0, ceil(extract(epoch FROM v_free_at - v_now) * 1000))::bigint
                    END,
                    v_now)
            RETURNING * INTO v_msg;

            INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                               campaign_id, topic, blocked_scope, used, cap,
                                               retry_after_ms, created_at)
            VALUES (p_user_id, p_message_id, p_tier, r_rule.rule_name, v_tier.on_exceed,
                    p_campaign_id, p_topic, r_rule.scope, v_used, r_rule.cap,
                    v_msg.retry_after_ms, v_now);

            RETURN QUERY SELECT false, v_msg.action, v_msg.reason, v_used, r_rule.cap,
                                v_msg.retry_after_ms, false;
            RETURN;
        END LOOP;

        -- Every rule passed: spend one slot in each budget.
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT p_user_id, tc.consumes, v_now, p_message_id
          FROM gov.tier_consumes tc WHERE tc.tier = p_tier
        UNION ALL
        SELECT p_user_id, 'topic:' || p_topic, v_now, p_message_id WHERE p_topic IS NOT NULL
        UNION ALL
        SELECT p_user_id, 'global', v_now, p_message_id;
    END IF;

    INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, decided_at)
    VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, true, v_now);

    RETURN QUERY SELECT true, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint, false;
END;
$$;

-- The send: the decision and, when it allows, one outbox row per live endpoint of the
-- user, in one call and one transaction. The budget is spent once per message whatever
-- the endpoint count (the fan-out happens after the allow). A repeat fans out nothing.
CREATE FUNCTION gov.send_v1(
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
BEGIN
    SELECT * INTO v_verdict
      FROM gov.decide_v1(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, v_now) d;

    IF NOT v_verdict.repeated THEN
        SELECT coalesce(p_ttl_s, t.default_ttl_s) INTO v_ttl_s FROM gov.tiers t WHERE t.tier = p_tier;
        INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
        VALUES (p_user_id, p_message_id, p_content, p_collapse_key, v_ttl_s,
                v_now + v_ttl_s * interval '1 second');
        IF v_verdict.allowed THEN
            WITH fan AS (
                INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
                SELECT p_user_id, p_message_id, s.id, v_now, v_now
                  FROM gov.subscriptions s
                 WHERE s.user_id = p_user_id AND s.retired_at IS NULL
                 ORDER BY s.id
                RETURNING id
            )
            SELECT array_agg(id ORDER BY id) INTO v_ids FROM fan;
        END IF;
    END IF;

    RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                        v_verdict.cap, v_verdict.retry_after_ms, v_verdict.repeated,
                        coalesce(v_ids, '{}'::bigint[]);
END;
$$;
