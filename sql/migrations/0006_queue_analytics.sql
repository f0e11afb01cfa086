-- Migration 0006, frozen: the queue meets analytics. Topic opt-outs enforced by the
-- decision, the deferral outcomes view, and gov check's deferred_overdue. Never edit.

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
                                                   retry_after_ms, created_at)
                VALUES (p_user_id, p_message_id, p_tier, v_rule, v_action, p_campaign_id, p_topic,
                        v_scope, v_used, v_cap, v_msg.retry_after_ms, v_now);
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

-- Deferral outcomes for analysts: per day held, tier, kind and state (with the reason).
CREATE VIEW gov.deferral_outcomes AS
SELECT date_trunc('day', d.enqueued_at AT TIME ZONE 'UTC')::date AS day,
       d.tier, d.kind, d.state, coalesce(d.outcome, 'waiting') AS outcome,
       count(*) AS messages,
       avg(extract(epoch FROM d.finished_at - d.enqueued_at))::numeric(12, 1) AS avg_wait_s
  FROM gov.deferred d
 GROUP BY 1, 2, 3, 4, 5;
