-- Migration 0015: a leaner decision. The policy is compiled at `gov policy apply` into
-- gov.compiled_rules (per tier, topic key and segment: the budgets to check in decision
-- order, each with all its windows), which gov.decide_core reads with one index scan; a
-- user's own caps are joined only for a user who has any; each budget's windows are
-- counted in one range scan; quiet hours are looked up only for a user with a time zone;
-- and an allowed message writes send rows only for budgets some cap reads
-- (gov.spent_budgets). A policy that caps a budget not written before fills it from
-- gov.messages (gov.backfill_sends_v1); what-if seeds its stand-ins the same way; the
-- state and spend checks expect only the budgets written. Self-contained: it compiles
-- the policy already stored.

-- The policy compiled for the decision: written by gov.compile_policy_v1 whenever the
-- policy is applied, read by gov.decide_core with one index scan. One group of rows per
-- (tier, topic key, segment): the topic key is '' for a message without a topic, '*' for
-- a topic without caps of its own, else a topic that has them; the segment is '' for the
-- tier's own windows, else a segment the policy gives windows. Each row is one budget the
-- decision checks, in decision order (seq: the topic, the consumed tiers from the own
-- tier downward, global), with every window of that budget ascending and its cap. A
-- topic row's budget is 'topic:', completed with the message's topic. A global policy
-- table (no user_id): a reference table on Citus, like gov.caps.
CREATE TABLE gov.compiled_rules (
    tier      text      NOT NULL,
    topic     text      NOT NULL,
    segment   text      NOT NULL,
    seq       integer   NOT NULL,
    budget    text      NOT NULL,
    scope     text      NOT NULL,
    windows   bigint[]  NOT NULL,
    caps      integer[] NOT NULL,
    PRIMARY KEY (tier, topic, segment, seq),
    CONSTRAINT compiled_rules_windows_match_caps
        CHECK (cardinality(windows) >= 1 AND cardinality(windows) = cardinality(caps))
);

-- ---------------------------------------------------------------- the compiled policy

-- Compile the stored policy into gov.compiled_rules (`gov policy apply` runs it in its
-- transaction, after the policy tables are written). The same rules the decision used to
-- assemble on every call: topic caps (the topic's own, else "*"), then each consumed
-- tier from the message's own tier downward (the user's segment's windows for that tier
-- when the policy has them, else the tier's own), then global.
CREATE FUNCTION gov.compile_policy_v1() RETURNS bigint
LANGUAGE sql AS $$
    DELETE FROM gov.compiled_rules;
    WITH segs AS (
        SELECT '' AS segment UNION SELECT sc.segment FROM gov.segment_caps sc
    ), topics AS (
        SELECT '' AS topic UNION SELECT '*' UNION SELECT c.topic FROM gov.caps c WHERE c.scope = 'topic'
    ), groups AS (
        SELECT t.tier, k.topic, s.segment
          FROM gov.tiers t CROSS JOIN topics k CROSS JOIN segs s
         WHERE NOT t.exempt
    ), rules AS (
        SELECT g.tier, g.topic, g.segment, 1 AS ord1, 0 AS ord2, 'topic:' AS budget, 'topic' AS scope,
               c.window_ms, c.cap
          FROM groups g JOIN gov.caps c ON c.scope = 'topic' AND c.topic = g.topic
        UNION ALL
        SELECT g.tier, g.topic, g.segment, 2,
               CASE WHEN tc.consumes = g.tier THEN -100 ELSE -substr(tc.consumes, 2)::int END,
               tc.consumes, tc.consumes, w.window_ms, w.cap
          FROM groups g
          JOIN gov.tier_consumes tc ON tc.tier = g.tier
         CROSS JOIN LATERAL (
                SELECT sc.window_ms, sc.cap FROM gov.segment_caps sc
                 WHERE sc.tier = tc.consumes AND sc.segment = g.segment
                UNION ALL
                SELECT c.window_ms, c.cap FROM gov.caps c
                 WHERE c.scope = tc.consumes AND c.topic = ''
                   AND NOT EXISTS (SELECT 1 FROM gov.segment_caps sc
                                    WHERE sc.tier = tc.consumes AND sc.segment = g.segment)) w
        UNION ALL
        SELECT g.tier, g.topic, g.segment, 3, 0, 'global', 'global', c.window_ms, c.cap
          FROM groups g JOIN gov.caps c ON c.scope = 'global'
    ), compiled AS (
        INSERT INTO gov.compiled_rules (tier, topic, segment, seq, budget, scope, windows, caps)
        SELECT r.tier, r.topic, r.segment,
               row_number() OVER (PARTITION BY r.tier, r.topic, r.segment ORDER BY r.ord1, r.ord2),
               r.budget, r.scope, array_agg(r.window_ms ORDER BY r.window_ms), array_agg(r.cap ORDER BY r.window_ms)
          FROM rules r
         GROUP BY r.tier, r.topic, r.segment, r.ord1, r.ord2, r.budget, r.scope
        RETURNING 1
    )
    SELECT count(*) FROM compiled;
$$;

-- The budgets an allowed message of p_tier with p_topic spends under the compiled
-- policy: those some cap reads, for a user of any segment. A budget no cap reads is not
-- written; a policy that caps it later fills it from gov.messages (gov.backfill_sends_v1).
CREATE FUNCTION gov.spent_budgets(p_tier text, p_topic text) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END),
                    '{}')
      FROM gov.compiled_rules r
     WHERE r.tier = p_tier
       AND r.topic = CASE WHEN p_topic IS NULL THEN ''
                          WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                          THEN p_topic ELSE '*' END
$$;

-- The budgets the compiled policy writes, as keys: a tier's name, 'global', 'topic:*' (every
-- topic: the policy has "*" caps) or 'topic:<topic>'. `gov policy apply` reads it before
-- it replaces the policy, for gov.backfill_sends_v1.
CREATE FUNCTION gov.capped_budgets() RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT CASE WHEN r.scope = 'topic' THEN 'topic:' || r.topic ELSE r.budget END),
                    '{}')
      FROM gov.compiled_rules r
$$;

-- After a policy caps a budget that was not written before (p_before: gov.capped_budgets()
-- under the previous policy), give every allowed message decided within the longest
-- window before p_now the rows of such budgets it would have spent, from gov.messages:
-- the new cap then counts the sends gov remembers instead of starting from nothing.
-- Budgets written before are left as they are. Returns the rows written.
CREATE FUNCTION gov.backfill_sends_v1(p_before text[], p_now timestamptz DEFAULT NULL) RETURNS bigint
LANGUAGE sql AS $$
    WITH horizon AS (
        SELECT coalesce(p_now, clock_timestamp()) AS t,
               (SELECT max(w) FROM gov.compiled_rules r, unnest(r.windows) w) AS longest_ms
    ), filled AS (
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT m.user_id, b.budget, m.decided_at, m.message_id
          FROM horizon h
          JOIN gov.messages m
            ON m.allowed AND m.decided_at > h.t - h.longest_ms * interval '1 millisecond' AND m.decided_at <= h.t
         CROSS JOIN LATERAL unnest(gov.spent_budgets(m.tier, m.topic)) AS b(budget)
         WHERE NOT b.budget = ANY (p_before)
           AND NOT (b.budget LIKE 'topic:%' AND 'topic:*' = ANY (p_before))
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM filled;
$$;

-- ---------------------------------------------------------------- the decision

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
LANGUAGE plpgsql
-- One generic plan per statement, kept for the session: measured, re-planning the rule
-- query on every call (PostgreSQL's custom plans for the first calls, and whenever the
-- generic one looks dearer) was most of a decision's server time.
SET plan_cache_mode = force_generic_plan
AS $$
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
    v_seg_key text := '';
    v_tz      text;
    v_topic   text := '';
    v_own     boolean;
    v_budget  text;
    v_window  bigint;
    v_counts  bigint[];
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
        -- The user's segment and time zone, read once under the user's lock. The segment
        -- chooses the windows of each consumed tier when the policy has that segment's
        -- (its own group of compiled rules); any other segment, or none, reads group ''.
        SELECT u.segment, u.time_zone INTO v_segment, v_tz FROM gov.users u WHERE u.user_id = p_user_id;
        -- The topic's own caps when it has any, else those of "*" ('' without a topic).
        IF p_topic IS NOT NULL THEN
            v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                            THEN p_topic ELSE '*' END;
        END IF;
        IF v_segment IS NOT NULL AND EXISTS (SELECT 1 FROM gov.compiled_rules r
                                              WHERE r.tier = p_tier AND r.topic = v_topic
                                                AND r.segment = v_segment) THEN
            v_seg_key := v_segment;
        END IF;
        -- A topic the user opted out of (the preference centre) is dropped, whatever
        -- the verb and the hour: holding it through the night would only drop it later.
        IF p_topic IS NOT NULL AND EXISTS (SELECT 1 FROM gov.user_topic_optouts o
                                            WHERE o.user_id = p_user_id AND o.topic = p_topic) THEN
            v_rule := 'topic_opt_out';
            v_scope := 'topic';
            v_action := 'drop';
            v_free_at := NULL;
        ELSIF v_tz IS NOT NULL THEN
            -- Quiet hours first: whatever the tier's verb, a message that arrives inside
            -- them waits until they end. Only a user with a time zone has them; P0
            -- (exempt) is never quieted.
            v_free_at := gov.quiet_until(p_user_id, v_now);
        END IF;
        IF v_rule IS NOT NULL THEN
            NULL;  -- opted out: decided above
        ELSIF v_free_at > v_now THEN
            v_rule := 'quiet_hours';
            v_scope := 'quiet_hours';
            v_action := 'defer';
        ELSE
            v_free_at := NULL;
            -- Does the user have caps of their own? Then each window's cap is the least of
            -- the default and theirs, and their cap over a window the segment's windows
            -- lack still holds on its own: segment windows never lift a user's own limit.
            v_own := EXISTS (SELECT 1 FROM gov.user_caps uc WHERE uc.user_id = p_user_id);
            <<rules>>
            FOR r_rule IN
                SELECT r.seq, r.budget, r.scope, r.windows, r.caps
                  FROM gov.compiled_rules r
                 WHERE NOT v_own AND r.tier = p_tier AND r.topic = v_topic AND r.segment = v_seg_key
                UNION ALL
                SELECT r.seq, r.budget, r.scope, o.windows, o.caps
                  FROM gov.compiled_rules r
                 CROSS JOIN LATERAL (
                        SELECT array_agg(x.w ORDER BY x.w) AS windows, array_agg(x.c ORDER BY x.w) AS caps
                          FROM (SELECT d.w, least(d.c, uc.cap) AS c
                                  FROM unnest(r.windows, r.caps) AS d(w, c)
                                  LEFT JOIN gov.user_caps uc
                                         ON uc.user_id = p_user_id AND uc.scope = r.scope AND uc.window_ms = d.w
                                UNION ALL
                                SELECT uo.window_ms, uo.cap
                                  FROM gov.user_caps uo
                                 WHERE uo.user_id = p_user_id AND uo.scope = r.scope
                                   AND r.scope NOT IN ('topic', 'global')
                                   AND EXISTS (SELECT 1 FROM gov.segment_caps s
                                                WHERE s.tier = r.scope AND s.segment = v_seg_key)
                                   AND NOT uo.window_ms = ANY (r.windows)
                                   -- only a cap with a default to lower, as the guard admits
                                   AND gov.user_cap_ceiling(uo.scope, uo.window_ms) IS NOT NULL) x
                       ) o
                 WHERE v_own AND r.tier = p_tier AND r.topic = v_topic AND r.segment = v_seg_key
                 ORDER BY 1
            LOOP
                v_budget := CASE WHEN r_rule.scope = 'topic' THEN 'topic:' || p_topic ELSE r_rule.budget END;
                -- Every window of the budget (up to four) in one range scan over the longest.
                SELECT ARRAY[count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[1] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[2] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[3] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[4] * interval '1 millisecond')]
                  INTO v_counts
                  FROM gov.sends s
                 WHERE s.user_id = p_user_id AND s.budget = v_budget
                   AND s.sent_at > v_now - r_rule.windows[least(cardinality(r_rule.windows), 4)]
                                           * interval '1 millisecond';
                FOR i IN 1 .. cardinality(r_rule.windows) LOOP
                    v_window := r_rule.windows[i];
                    IF i <= 4 THEN
                        v_used := v_counts[i];
                    ELSE  -- a fifth window and beyond: a count of its own
                        SELECT count(*) INTO v_used
                          FROM gov.sends s
                         WHERE s.user_id = p_user_id AND s.budget = v_budget
                           AND s.sent_at > v_now - v_window * interval '1 millisecond';
                    END IF;
                    CONTINUE WHEN v_used < r_rule.caps[i];

                    -- Blocked. A slot frees when enough of the oldest rows leave the window
                    -- for the count to drop below the cap (more than one when a cap was lowered).
                    v_cap := r_rule.caps[i];
                    IF v_cap > 0 THEN  -- a cap of 0 never frees a slot
                        SELECT s.sent_at + v_window * interval '1 millisecond' INTO v_free_at
                          FROM gov.sends s
                         WHERE s.user_id = p_user_id AND s.budget = v_budget
                           AND s.sent_at > v_now - v_window * interval '1 millisecond'
                         ORDER BY s.sent_at
                        OFFSET v_used - v_cap LIMIT 1;
                    END IF;
                    v_rule := CASE r_rule.scope WHEN 'topic' THEN 'topic_cap_' WHEN 'global' THEN 'global_cap_'
                                                ELSE 'cap_' END || v_window || 'ms';
                    v_scope := r_rule.scope;
                    v_action := v_tier.on_exceed;
                    EXIT rules;
                END LOOP;
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

        -- Every rule passed: spend one slot in each budget some cap reads (for a user of
        -- any segment, so a change of segment finds the history it needs).
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT DISTINCT p_user_id, CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END,
               v_now, p_message_id
          FROM gov.compiled_rules r
         WHERE r.tier = p_tier AND r.topic = v_topic;
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

-- ---------------------------------------------------------------- readers of gov.sends

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
        -- the stand-ins start from each user's real history before the window: the send
        -- rows, and every allowed message in gov.messages spending the budgets the
        -- candidate has it spend (a decision writes rows only for budgets a cap reads, so
        -- a candidate capping a budget the live policy leaves uncapped, global say, still
        -- counts the sends before the window)
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v_tag || h.user_id, h.budget, h.sent_at, h.message_id
          FROM (SELECT s.user_id, s.budget, s.sent_at, s.message_id
                  FROM gov.sends s
                 WHERE s.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
                UNION
                SELECT m.user_id, b.budget, m.decided_at, m.message_id
                  FROM gov.messages m
                 CROSS JOIN LATERAL unnest(gov.spent_budgets(m.tier, m.topic)) AS b(budget)
                 WHERE m.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
                   AND m.allowed
                   AND NOT EXISTS (SELECT 1 FROM gov.sends s
                                    WHERE s.user_id = m.user_id AND s.budget = b.budget
                                      AND s.message_id = m.message_id)) h
         WHERE h.sent_at <= v_from
           AND h.sent_at > v_from - (SELECT coalesce(max(w.window_ms), 0)
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
                  AND cardinality(gov.spent_budgets(m.tier, m.topic)) > 0
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

SELECT gov.compile_policy_v1();
