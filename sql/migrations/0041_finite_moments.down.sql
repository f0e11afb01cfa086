-- Migration 0041, undone: the functions as migration 0040 left them.

-- The decision itself, shared by a first decision (gov.decide_v1, gov.send_v1) and a
-- re-decision at release (p_release: the message was decided before and waited; it
-- is decided again now, its verdict updated, and no second suppression is logged).
-- The rules come compiled (gov.compiled_rules, written at `gov policy apply`): one index
-- scan for the (tier, topic, segment) group, a user's own caps joined only for a user
-- who has any. Each budget's windows are counted in one range scan of gov.sends over the
-- longest of them; the moment a slot frees is computed only for the window that blocks.
-- An allowed message writes a send row only for the budgets some cap reads.
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
    v_uc      jsonb;
    v_spend   text[];
    c_rules   refcursor;
BEGIN
    IF p_user_id IS NULL OR p_user_id = '' THEN
        RAISE EXCEPTION 'user_id is required' USING ERRCODE = 'GV001';
    END IF;
    IF p_message_id IS NULL OR p_message_id = '' THEN
        RAISE EXCEPTION 'message id is required (user %)', p_user_id USING ERRCODE = 'GV001';
    END IF;
    SELECT * INTO v_tier FROM gov.policy_tier(p_tier) t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown tier % for message % (the policy defines: %)', p_tier, p_message_id,
            (SELECT string_agg(t.tier, ', ' ORDER BY t.tier) FROM gov.tiers t)
            USING ERRCODE = 'GV001';
    END IF;

    PERFORM pg_advisory_xact_lock(hashtextextended(p_user_id, 0));
    PERFORM gov.cluster_user_lock(p_user_id);

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
        -- (Each probe below runs only when its condition can hold, in an IF of its own: a
        -- condition joined by AND to an EXISTS is one statement, which on a Citus cluster
        -- is planned again on every call, topic or not, segment or not.)
        -- The topic's own caps when it has any, else those of "*" ('' without a topic).
        IF p_topic IS NOT NULL THEN
            v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.policy_caps('topic', p_topic)) THEN p_topic ELSE '*' END;
        END IF;
        IF v_segment IS NOT NULL THEN
            IF EXISTS (SELECT 1 FROM gov.policy_rules(p_tier, v_topic, v_segment)) THEN
                v_seg_key := v_segment;
            END IF;
        END IF;
        -- A topic the user opted out of (the preference centre) is dropped, whatever
        -- the verb and the hour: holding it through the night would only drop it later.
        IF p_topic IS NOT NULL THEN
            PERFORM 1 FROM gov.user_topic_optouts o WHERE o.user_id = p_user_id AND o.topic = p_topic;
            IF FOUND THEN
                v_rule := 'topic_opt_out';
                v_scope := 'topic';
                v_action := 'drop';
            END IF;
        END IF;
        IF v_rule IS NULL AND v_tz IS NOT NULL THEN
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
            -- (Read alone, not joined: the rule query then reads only policy tables, which on a
            -- Citus cluster are reference tables beside the user's shard.)
            SELECT jsonb_agg(jsonb_build_object('scope', uc.scope, 'window_ms', uc.window_ms, 'cap', uc.cap))
              INTO v_uc
              FROM gov.user_caps uc WHERE uc.user_id = p_user_id;
            v_own := v_uc IS NOT NULL;
            -- Two queries, one cursor: a plan is initialised whole on every execution,
            -- and the own-caps query's nodes (lateral, sorts, jsonb functions) were a fifth
            -- of a plain user's decision when both stood in one UNION ALL (docs/performance.md).
            IF v_own THEN
                OPEN c_rules FOR
                    SELECT r.seq, r.budget, r.scope, o.windows, o.caps
                      FROM gov.compiled_rules r
                     CROSS JOIN LATERAL (
                            SELECT array_agg(x.w ORDER BY x.w) AS windows, array_agg(x.c ORDER BY x.w) AS caps
                              FROM (SELECT d.w, least(d.c, uc.cap) AS c
                                      FROM unnest(r.windows, r.caps) AS d(w, c)
                                      LEFT JOIN jsonb_to_recordset(v_uc) AS uc(scope text, window_ms bigint, cap integer)
                                             ON uc.scope = r.scope AND uc.window_ms = d.w
                                    UNION ALL
                                    SELECT uo.window_ms, uo.cap
                                      FROM jsonb_to_recordset(v_uc) AS uo(scope text, window_ms bigint, cap integer)
                                     WHERE uo.scope = r.scope
                                       AND r.scope NOT IN ('topic', 'global')
                                       AND EXISTS (SELECT 1 FROM gov.segment_caps s
                                                    WHERE s.tier = r.scope AND s.segment = v_seg_key)
                                       AND NOT uo.window_ms = ANY (r.windows)
                                       -- only a cap with a default to lower, as the guard admits
                                       AND gov.user_cap_ceiling(uo.scope, uo.window_ms) IS NOT NULL) x
                           ) o
                     WHERE r.tier = p_tier AND r.topic = v_topic AND r.segment = v_seg_key
                     ORDER BY 1;
            ELSE
                OPEN c_rules FOR
                    SELECT r.seq, r.budget, r.scope, r.windows, r.caps
                      FROM gov.policy_rules(p_tier, v_topic, v_seg_key) r
                     ORDER BY r.seq;
            END IF;
            <<rules>>
            LOOP
                FETCH c_rules INTO r_rule;
                EXIT WHEN NOT FOUND;
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
            CLOSE c_rules;
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
        -- (Gathered first, then one row per insert: an insert that reads no policy table is
        -- one shard's on Citus, and a single-row VALUES is a statement Citus caches, where
        -- INSERT … SELECT FROM unnest() is planned and copied on every call.)
        v_spend := ARRAY(SELECT b FROM gov.policy_spend(p_tier, v_topic, p_topic) b);
        FOREACH v_budget IN ARRAY v_spend LOOP
            INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
            VALUES (p_user_id, v_budget, v_now, p_message_id);
        END LOOP;
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

-- Decide one tier's messages for plain users (gov.plain_users: locked, and none of what
-- makes a user's decision their own), each user with their own message id, in one
-- statement, with the verdicts and the message, suppression and send rows
-- gov.decide_core gives each of them: every window of every rule counted per user (one
-- range scan per budget over its longest window), the first that blocks in decision
-- order, the moment a slot frees for it. A fraction of a decision's cost per user. A
-- user appears once (a second message of theirs would not see the first's spend).
-- Rows come in no promised order.
CREATE OR REPLACE FUNCTION gov.decide_together(
    p_users       text[],
    p_message_ids text[],
    p_tier        text,
    p_topic       text,
    p_campaign_id text,
    p_now         timestamptz
) RETURNS TABLE (
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint
)
LANGUAGE plpgsql
-- Generic plans, as gov.decide_core: the statement below, planned per call, cost a
-- small batch (gov serve's) twice what it cost to run (pgbench, docs/performance.md).
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_tier  gov.tiers%ROWTYPE;
    v_topic text := '';
    v_spend text[];
BEGIN
    SELECT * INTO STRICT v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    IF p_topic IS NOT NULL THEN
        v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                        THEN p_topic ELSE '*' END;
    END IF;
    -- What an allowed message spends, as gov.decide_core writes it.
    v_spend := CASE WHEN v_tier.exempt THEN '{}'::text[] ELSE ARRAY(
        SELECT DISTINCT CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END
          FROM gov.compiled_rules r
         WHERE r.tier = p_tier AND r.topic = v_topic) END;
    RETURN QUERY
    WITH rules AS (
        SELECT r.seq, r.scope, r.windows, r.caps,
               CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END AS budget
          FROM gov.compiled_rules r
         WHERE NOT v_tier.exempt AND r.tier = p_tier AND r.topic = v_topic AND r.segment = ''
    ), checked AS (
        SELECT p.u, r.seq, r.scope, r.budget, x.i, x.w, x.c,
               CASE WHEN x.i <= 4 THEN k.counts[x.i]
                    ELSE (SELECT count(*) FROM gov.sends s
                           WHERE s.user_id = p.u AND s.budget = r.budget
                             AND s.sent_at > p_now - x.w * interval '1 millisecond') END AS n
          FROM unnest(p_users) p(u)
         CROSS JOIN rules r
         CROSS JOIN LATERAL (
                SELECT ARRAY[count(*) FILTER (WHERE s.sent_at > p_now - r.windows[1] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > p_now - r.windows[2] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > p_now - r.windows[3] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > p_now - r.windows[4] * interval '1 millisecond')]
                       AS counts
                  FROM gov.sends s
                 WHERE s.user_id = p.u AND s.budget = r.budget
                   AND s.sent_at > p_now - r.windows[least(cardinality(r.windows), 4)] * interval '1 millisecond') k
         CROSS JOIN LATERAL unnest(r.windows, r.caps) WITH ORDINALITY AS x(w, c, i)
    ), blocked AS (
        SELECT DISTINCT ON (ch.u) ch.u, ch.scope, ch.budget, ch.w, ch.c, ch.n
          FROM checked ch
         WHERE ch.n >= ch.c
         ORDER BY ch.u, ch.seq, ch.i
    ), verdict AS (
        SELECT p.u, p.m, b.u IS NULL AS ok, b.scope,
               CASE WHEN b.u IS NOT NULL THEN v_tier.on_exceed END AS act,
               CASE b.scope WHEN 'topic' THEN 'topic_cap_' WHEN 'global' THEN 'global_cap_' ELSE 'cap_' END
                   || b.w || 'ms' AS rule,
               b.n::integer AS n, b.c AS c,
               -- a slot frees when enough of the oldest rows leave the window (a cap of 0: never)
               CASE WHEN f.free_at IS NOT NULL
                    THEN greatest(0, ceil(extract(epoch FROM f.free_at - p_now) * 1000))::bigint END AS retry
          FROM unnest(p_users, p_message_ids) p(u, m)
          LEFT JOIN blocked b ON b.u = p.u
          LEFT JOIN LATERAL (
                 SELECT (array_agg(s.sent_at ORDER BY s.sent_at))[b.n - b.c + 1]
                        + b.w * interval '1 millisecond' AS free_at
                   FROM gov.sends s
                  WHERE b.c > 0 AND s.user_id = b.u AND s.budget = b.budget
                    AND s.sent_at > p_now - b.w * interval '1 millisecond') f ON b.u IS NOT NULL
    ), spent AS (
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v.u, sb.b, p_now, v.m FROM verdict v CROSS JOIN unnest(v_spend) sb(b) WHERE v.ok
    ), decided AS (
        INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                  reason, used, cap, retry_after_ms, decided_at)
        SELECT v.u, v.m, p_tier, p_topic, p_campaign_id, v.ok, v.act, v.rule, v.n, v.c, v.retry, p_now
          FROM verdict v
    ), logged AS (
        INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                           campaign_id, topic, blocked_scope, used, cap,
                                           retry_after_ms, created_at, segment)
        SELECT v.u, v.m, p_tier, v.rule, v.act, p_campaign_id, p_topic, v.scope, v.n, v.c,
               v.retry, p_now, (SELECT u.segment FROM gov.users u WHERE u.user_id = v.u)
          FROM verdict v
         WHERE NOT v.ok
         ORDER BY v.u
    )
    SELECT v.u, v.ok, v.act, v.rule, v.n, v.c, v.retry FROM verdict v;
END;
$$;

-- Remove send rows no window can see any more (older than the longest window plus a
-- margin), at most p_batch rows per call, so each call is a short transaction that
-- never holds up decisions (they only read recent rows of their own user). Returns
-- how many rows went; call again until it returns 0.
CREATE OR REPLACE FUNCTION gov.prune_sends_v1(p_batch integer, p_margin interval, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_longest bigint;
    v_count   integer;
BEGIN
    -- the longest window any cap reads: the tiers', topics' and global ones, a segment's
    -- own windows (which may be longer than its tier's), and users' own caps
    SELECT greatest((SELECT coalesce(max(c.window_ms), 0) FROM gov.caps c),
                    (SELECT coalesce(max(sc.window_ms), 0) FROM gov.segment_caps sc),
                    (SELECT coalesce(max(uc.window_ms), 0) FROM gov.user_caps uc))
      INTO v_longest;
    -- by primary key, not ctid: on a Citus cluster the rows are in many shards
    DELETE FROM gov.sends s
     WHERE (s.user_id, s.budget, s.sent_at, s.message_id) IN (
            SELECT x.user_id, x.budget, x.sent_at, x.message_id FROM gov.sends x
             WHERE x.sent_at < v_now - v_longest * interval '1 millisecond' - p_margin
             LIMIT p_batch);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        -- what is older than this may have lost its send rows: the conservation check
        -- must not read a pruned message as "allowed without spending its budget"
        UPDATE gov.settings s
           SET pruned_before = greatest(s.pruned_before, v_now - v_longest * interval '1 millisecond' - p_margin);
    END IF;
    RETURN v_count;
END;
$$;

-- Remove analyst history (suppressions, delivery attempts) older than p_keep, in
-- batches like gov.prune_sends_v1.
CREATE OR REPLACE FUNCTION gov.prune_history_v1(p_batch integer, p_keep interval, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_cut   timestamptz := coalesce(p_now, clock_timestamp()) - p_keep;
    v_count integer;
    v_more  integer;
BEGIN
    DELETE FROM gov.push_suppressions ps
     WHERE (ps.user_id, ps.id) IN (SELECT x.user_id, x.id FROM gov.push_suppressions x
                                    WHERE x.created_at < v_cut LIMIT p_batch);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM gov.delivery_attempts da
     WHERE (da.user_id, da.id) IN (SELECT x.user_id, x.id FROM gov.delivery_attempts x
                                    WHERE x.attempted_at < v_cut LIMIT p_batch);
    GET DIAGNOSTICS v_more = ROW_COUNT;
    RETURN v_count + v_more;
END;
$$;
