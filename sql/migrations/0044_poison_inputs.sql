-- Migration 0044: inputs that would poison state are refused, found by an outside probe.
-- * gov.prune_sends_v1 at a moment later than the database clock deleted send rows a
--   window still reads (a user then went past a cap, and gov.settings.pruned_before
--   moved ahead, hiding it from the conservation check): refused, GV003; and
--   gov.prune_history_v1 likewise.
-- * A decision at a finite far-future moment (the year 294276) wrote send rows every
--   later window counts: gov.decide_core and gov.decide_together refuse a moment more
--   than gov.moment_ahead_limit() (366 days) ahead of the database clock, GV001; ids,
--   topics and campaigns longer than 256 characters are refused by name, GV001.
-- * A claim with a 100-year lease or at a far-future moment stranded rows in 'sending':
--   gov.claim_outbox_v3 refuses a lease over a day and such a moment, 22023.
-- * gov.retire_tiers_v1 dropped an exempt tier's queued messages (P0 suppressions):
--   refused, GV003.
-- * gov.send_v1 stored content no push can be built from ('[]', a 1 MB title) and spent
--   a slot on it: content must be an object with a title, at most 4096 bytes as text
--   (gov.content_ok), and a TTL at most 28 days, GV001; the batch paths leave such a
--   message to gov.send_v1, which refuses it.
-- * gov.record_event_v1 and gov.refresh_segments_v1 refuse a moment at infinity, GV003;
--   gov.hour_curves_v1 (and so gov.best_hours_v1) refuses a prior strength of NaN or
--   infinity, 22023; gov.fatigue_marginal_v1 a negative or NULL minimum, 22023;
--   gov.sends_to_decide_v1 answers NULL for a negative p_z, as gov.wilson_interval_v1.
-- Signatures unchanged. As in sql/schema/ at this revision. On a Citus cluster gov db
-- upgrade binds the new decision body to the shards again (gov.distribute_v1).

-- How far ahead of the database clock a moment may be: a decision's, a claim's. A
-- window counts every send after its start, so a send row in the year 294276 would
-- spend the user's budget until then; a year keeps simulated and test clocks usable.
CREATE FUNCTION gov.moment_ahead_limit() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '366 days' $$;

-- The longest lease a claim may take: a dead runner's rows wait that long.
CREATE FUNCTION gov.max_lease_ms() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 86400000::bigint $$;

-- Content a push can be built from, as the Python API checks it: a JSON object with a
-- title that is a string with something to show, and no more than the 4096 bytes of
-- one push record as text (the runner's encrypted payload must fit in one).
CREATE FUNCTION gov.content_ok(p_content jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_typeof(p_content) = 'object' AND jsonb_typeof(p_content -> 'title') = 'string'
                    AND (p_content ->> 'title') ~ '[^[:space:]]' AND octet_length(p_content::text) <= 4096, false)
$$;

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
    IF NOT isfinite(v_now) OR v_now > clock_timestamp() + gov.moment_ahead_limit() THEN
        -- a send row at infinity (or in the year 294276) would sit in every window of the
        -- user's until then: a window counts every send after its start
        RAISE EXCEPTION 'the moment of a decision must be a finite time at most % ahead of the database clock,'
            ' not % (message % of user %)', gov.moment_ahead_limit(), v_now, p_message_id, p_user_id
            USING ERRCODE = 'GV001';
    END IF;
    IF length(p_user_id) > 256 OR length(p_message_id) > 256 OR length(p_topic) > 256 OR length(p_campaign_id) > 256
    THEN
        RAISE EXCEPTION 'ids, topics and campaigns are at most 256 characters (message % of user %)',
            left(p_message_id, 64), left(p_user_id, 64) USING ERRCODE = 'GV001';
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
    IF NOT isfinite(p_now) OR p_now > clock_timestamp() + gov.moment_ahead_limit() THEN  -- as gov.decide_core
        RAISE EXCEPTION 'the moment of a decision must be a finite time at most % ahead of the database clock, not %',
            gov.moment_ahead_limit(), p_now USING ERRCODE = 'GV001';
    END IF;
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

-- The send: the decision and, when it allows, one outbox row per live endpoint of the
-- user, in one call and one transaction. The budget is spent once per message whatever
-- the endpoint count (the fan-out happens after the allow). A repeat fans out nothing.
-- A suppressed message is held by its verb (defer, collapse) or quiet hours, or dropped.
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
    IF p_ttl_s IS NOT NULL AND (p_ttl_s < 1 OR p_ttl_s > 2419200) THEN
        RAISE EXCEPTION 'ttl must be from 1 second to 28 days (message % of user %, ttl %)', p_message_id, p_user_id,
            p_ttl_s USING ERRCODE = 'GV001';
    END IF;
    -- what the runner will build a push from: refused here, before a slot is spent on it
    IF NOT gov.content_ok(p_content) THEN
        RAISE EXCEPTION 'content must be a JSON object with a non-blank string title, at most 4096 bytes as text'
            ' (message % of user %)', left(p_message_id, 64), left(p_user_id, 64) USING ERRCODE = 'GV001';
    END IF;
    SELECT coalesce(p_ttl_s, t.default_ttl_s), t.on_exceed INTO v_ttl_s, v_verb FROM gov.tiers t WHERE t.tier = p_tier;
    IF v_verb IN ('defer', 'collapse') THEN
        -- a slot that opened for held rows with a nearer deadline is theirs (earliest
        -- deadline first): they go before this message is decided
        PERFORM gov.release_owed(p_user_id, p_tier, p_collapse_key, v_now + v_ttl_s * interval '1 second', v_now);
    END IF;
    SELECT * INTO v_verdict
      FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;

    IF v_verdict.repeated THEN
        RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                            v_verdict.cap, v_verdict.retry_after_ms, true, '{}'::bigint[];
        RETURN;
    END IF;

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

-- Send a batch of unrelated messages (any users, tiers, topics, content) in one call and
-- one transaction: what `gov serve` does with the requests that arrive together. Each
-- message gets the verdict, rows and fan-out gov.send_v1 would give it alone, one call
-- after the other in user order, then in the order given (ordinal, from 1): a user's
-- later message in the batch sees the earlier one's spend. What the batch saves is the
-- round trip and the durable commit per message (most of an allowed decision's cost),
-- and on one server the per-message work: the messages of users with one message in the
-- batch, plain ones (gov.plain_users) of a tier that holds nothing (exempt, or one that
-- drops), are decided together, per tier, topic and campaign, by gov.decide_together,
-- their content stored and fanned out in a few statements; the rest go through
-- gov.send_v1, as does everything on a Citus cluster. Every user of the batch is locked
-- first, in user order, the order every batch uses, so batches never wait on each other
-- in a cycle. An error in any message (an unknown tier, say) fails the whole call and
-- nothing is written: the caller then sends each message alone, so the error stays with
-- its message (gov.aio.AsyncGovernor.send_batch). p_shard_key: on a Citus cluster, one
-- shard's messages decided on the worker that holds them (gov.shard_groups_v1); NULL on
-- one server. Rows come in no promised order.
CREATE OR REPLACE FUNCTION gov.send_batch_v1(
    p_shard_key     text,
    p_user_ids      text[],
    p_message_ids   text[],
    p_tiers         text[],
    p_topics        text[],
    p_campaign_ids  text[],
    p_contents      jsonb[],
    p_collapse_keys text[],
    p_ttls          integer[],
    p_now           timestamptz DEFAULT NULL
) RETURNS TABLE (
    ordinal        integer,
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean,
    outbox_ids     bigint[]
)
LANGUAGE plpgsql
-- Generic plans, as gov.decide_core (a batch of one: 1.19 ms instead of 3.17 by pgbench).
-- On a Citus cluster gov.distribute_v1 resets it: the setting holds for the functions it
-- calls, and a worker cannot route a generic plan of gov.decide_core's statements.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_n     integer := coalesce(cardinality(p_user_ids), 0);
    v_done  integer[] := '{}';
    r_group record;
    r_msg   record;
    v_plain text[];
BEGIN
    IF coalesce(cardinality(p_message_ids), 0) <> v_n OR coalesce(cardinality(p_tiers), 0) <> v_n
       OR coalesce(cardinality(p_topics), 0) <> v_n OR coalesce(cardinality(p_campaign_ids), 0) <> v_n
       OR coalesce(cardinality(p_contents), 0) <> v_n OR coalesce(cardinality(p_collapse_keys), 0) <> v_n
       OR coalesce(cardinality(p_ttls), 0) <> v_n THEN
        RAISE EXCEPTION 'a batch''s arrays must have one entry per message (% user ids)', v_n
            USING ERRCODE = 'GV003';
    END IF;
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    IF NOT gov.distributed() THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(x.u, 0))
           FROM (SELECT DISTINCT u FROM unnest(p_user_ids) u WHERE u <> '') x
          ORDER BY x.u;
        -- (bad input, an unknown tier, no message id, a TTL out of range, an empty or long
        -- id, content no push can be built from, is left to gov.send_v1 to refuse)
        FOR r_group IN
            WITH msg AS (
                SELECT x.*, count(*) OVER (PARTITION BY x.u) AS mine
                  FROM unnest(p_user_ids, p_message_ids, p_tiers, p_topics, p_campaign_ids)
                       WITH ORDINALITY AS x(u, m, t, tp, c, n)
            )
            SELECT msg.t, msg.tp, msg.c, array_agg(msg.u ORDER BY msg.u) AS us, array_agg(msg.m ORDER BY msg.u) AS ms
              FROM msg JOIN gov.tiers t ON t.tier = msg.t AND (t.exempt OR t.on_exceed = 'drop')
             WHERE msg.mine = 1 AND msg.u <> '' AND msg.m <> ''
               AND length(msg.u) <= 256 AND length(msg.m) <= 256
               AND (p_ttls[msg.n] IS NULL OR p_ttls[msg.n] BETWEEN 1 AND 2419200)
               AND gov.content_ok(p_contents[msg.n])
             GROUP BY msg.t, msg.tp, msg.c
        LOOP
            v_plain := gov.plain_users(r_group.us, r_group.ms, r_group.t, r_group.tp, v_now);
            CONTINUE WHEN cardinality(v_plain) = 0;
            RETURN QUERY
            WITH decided AS (
                SELECT d.*, x.n::integer AS n
                  FROM gov.decide_together(
                           v_plain,
                           ARRAY(SELECT p_message_ids[x.n] FROM unnest(p_user_ids) WITH ORDINALITY x(u, n)
                                   JOIN unnest(v_plain) WITH ORDINALITY pu(u, k) ON pu.u = x.u ORDER BY pu.k),
                           r_group.t, r_group.tp, r_group.c, v_now) d
                  JOIN unnest(p_user_ids) WITH ORDINALITY x(u, n) ON x.u = d.user_id
            ), content AS (  -- every decided message keeps its content, as send_v1 stores it (a drop too)
                INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
                SELECT d.user_id, p_message_ids[d.n], p_contents[d.n], p_collapse_keys[d.n], l.ttl_s,
                       v_now + l.ttl_s * interval '1 second'
                  FROM decided d
                 CROSS JOIN LATERAL (SELECT coalesce(p_ttls[d.n], t.default_ttl_s) AS ttl_s
                                       FROM gov.tiers t WHERE t.tier = r_group.t) l
            ), fan AS (  -- gov.fan_out for every allowed message: one outbox row per live endpoint
                INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
                SELECT s.user_id, p_message_ids[d.n], s.id, v_now, v_now
                  FROM gov.subscriptions s
                  JOIN decided d ON d.user_id = s.user_id AND d.allowed
                 WHERE s.retired_at IS NULL
                 ORDER BY s.user_id, s.id
                RETURNING gov.outbox.user_id AS u, gov.outbox.id
            )
            SELECT d.n, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, false,
                   coalesce((SELECT array_agg(f.id ORDER BY f.id) FROM fan f WHERE f.u = d.user_id), '{}'::bigint[])
              FROM decided d;
            v_done := v_done || ARRAY(SELECT x.n::integer FROM unnest(p_user_ids) WITH ORDINALITY x(u, n)
                                       WHERE x.u = ANY (v_plain));
        END LOOP;
    END IF;
    FOR r_msg IN
        SELECT x.n::integer AS n, x.u, x.m, x.t, x.tp, x.c, x.ct, x.ck, x.ttl
          FROM unnest(p_user_ids, p_message_ids, p_tiers, p_topics, p_campaign_ids, p_contents,
                      p_collapse_keys, p_ttls) WITH ORDINALITY AS x(u, m, t, tp, c, ct, ck, ttl, n)
         WHERE NOT x.n::integer = ANY (v_done)
         ORDER BY x.u, x.n
    LOOP
        RETURN QUERY
        SELECT r_msg.n, s.allowed, s.action, s.reason, s.used, s.cap, s.retry_after_ms, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_msg.u, r_msg.m, r_msg.t, r_msg.tp, r_msg.c, r_msg.ct, r_msg.ck, r_msg.ttl, v_now) s;
    END LOOP;
END;
$$;

-- The same for sends: decide, store the content, fan out or hold, per user, with what
-- gov.send_v1 gives each. On one server, for a tier that holds nothing (exempt, or one
-- that drops), the plain users are decided together and their content stored and fanned
-- out in a few statements; a tier that defers or collapses sends everyone through
-- gov.send_v1, as does a Citus cluster. Rows come in no promised order.
CREATE OR REPLACE FUNCTION gov.send_many_v2(
    p_shard_key    text,
    p_user_ids     text[],
    p_message_id   text,
    p_tier         text,
    p_topic        text,
    p_campaign_id  text,
    p_content      jsonb,
    p_collapse_key text,
    p_ttl_s        integer,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    repeated       boolean,
    outbox_ids     bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_users  text[];
    v_plain  text[] := '{}';
    v_ttl_s  integer;
    v_u      text[];
    v_ok     boolean[];
    v_action text[];
    v_reason text[];
    r_user   record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    v_users := ARRAY(SELECT DISTINCT u FROM unnest(p_user_ids) u ORDER BY 1);
    SELECT coalesce(p_ttl_s, t.default_ttl_s) INTO v_ttl_s
      FROM gov.tiers t WHERE t.tier = p_tier AND (t.exempt OR t.on_exceed = 'drop');
    -- Bad input (an unknown tier, no message id, a TTL out of range, an empty user id,
    -- content no push can be built from) is send_v1's to refuse.
    IF FOUND AND p_message_id <> '' AND length(p_message_id) <= 256 AND (p_ttl_s IS NULL OR p_ttl_s BETWEEN 1 AND 2419200)
       AND gov.content_ok(p_content) AND NOT gov.distributed() THEN
        v_plain := gov.lock_batch(v_users, p_message_id, p_tier, p_topic, v_now);
        SELECT coalesce(array_agg(d.user_id), '{}'), coalesce(array_agg(d.allowed), '{}'),
               coalesce(array_agg(d.action), '{}'), coalesce(array_agg(d.reason), '{}')
          INTO v_u, v_ok, v_action, v_reason
          FROM gov.decide_together(v_plain, p_message_id, p_tier, p_topic, p_campaign_id, v_now) d;
        -- every decided message keeps its content, as send_v1 stores it (a drop too)
        INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
        SELECT u, p_message_id, p_content, p_collapse_key, v_ttl_s, v_now + v_ttl_s * interval '1 second'
          FROM unnest(v_u) u;
        RETURN QUERY
        WITH fan AS (  -- gov.fan_out for every allowed user: one outbox row per live endpoint
            INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
            SELECT s.user_id, p_message_id, s.id, v_now, v_now
              FROM gov.subscriptions s
              JOIN unnest(v_u, v_ok) AS d(u, ok) ON d.u = s.user_id AND d.ok
             WHERE s.retired_at IS NULL
             ORDER BY s.user_id, s.id
            RETURNING gov.outbox.user_id AS u, gov.outbox.id
        )
        SELECT d.u, d.ok, d.act, d.why, false,
               coalesce((SELECT array_agg(f.id ORDER BY f.id) FROM fan f WHERE f.u = d.u), '{}'::bigint[])
          FROM unnest(v_u, v_ok, v_action, v_reason) AS d(u, ok, act, why);
    END IF;
    FOR r_user IN SELECT u AS id FROM unnest(v_users) u WHERE NOT u = ANY (v_plain) OR u IS NULL ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, s.allowed, s.action, s.reason, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, p_content,
                           p_collapse_key, p_ttl_s, v_now) s;
    END LOOP;
END;
$$;

-- Claim due outbox rows of one shard for one worker: pending rows whose time has come,
-- and rows whose lease ran out (their worker died or overran). SKIP LOCKED lets runners
-- claim side by side without waiting on each other; the lease is committed, so no
-- transaction stays open across the HTTP call. Every claim increments the row's
-- claim_token, the fencing token gov.record_attempt_v3 requires: a runner whose lease
-- ran out and whose row was claimed again can no longer record anything for it. A row
-- whose endpoint was retired meanwhile (a 404/410 for another message) ends 'gone' here,
-- unsent and not returned. Content, message and tier are joined loosely, so a row whose
-- content is missing is returned (and failed by the runner) rather than claimed and lost.
-- p_shard_key: the shard to claim from (NULL on one server; 70_scale_out.sql).
-- p_ids restricts the claim to given rows (gov.send's immediate attempt).
CREATE OR REPLACE FUNCTION gov.claim_outbox_v3(
    p_shard_key text,
    p_worker    text,
    p_limit     integer,
    p_lease_ms  bigint,
    p_now       timestamptz DEFAULT NULL,
    p_ids       bigint[]    DEFAULT NULL
) RETURNS TABLE (
    outbox_id       bigint,
    claim_token     bigint,
    user_id         text,
    message_id      text,
    tier            text,
    attempts        integer,
    subscription_id bigint,
    endpoint        text,
    p256dh          text,
    auth            text,
    content         jsonb,
    collapse_key    text,
    ttl_s           integer,
    urgency         text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'claim limit must be positive, got %', p_limit USING ERRCODE = '22023';
    END IF;
    -- a lease is what a dead runner's rows wait for: at most a day (gov.max_lease_ms())
    IF p_lease_ms IS NULL OR p_lease_ms < 1 OR p_lease_ms > gov.max_lease_ms() THEN
        RAISE EXCEPTION 'lease must be positive and at most a day, got % ms', p_lease_ms USING ERRCODE = '22023';
    END IF;
    -- a claim far ahead of the clock would take over rows other runners hold and strand
    -- them in 'sending' until then (gov.moment_ahead_limit(), as for decisions)
    IF NOT isfinite(v_now) OR v_now > clock_timestamp() + gov.moment_ahead_limit() THEN
        RAISE EXCEPTION 'a claim''s moment must be finite and at most % ahead of the database clock, not %',
            gov.moment_ahead_limit(), v_now USING ERRCODE = '22023';
    END IF;
    IF NOT gov.distributed() THEN
        RETURN QUERY SELECT * FROM gov.claim_local(v_now, p_ids, p_limit, p_worker, p_lease_ms);
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(gov.claim_statement(),
        gov.shard_relation('gov.outbox', p_shard_key), gov.shard_relation('gov.subscriptions', p_shard_key),
        gov.shard_relation('gov.messages', p_shard_key), gov.shard_relation('gov.message_content', p_shard_key),
        gov.shard_relation('gov.tiers', p_shard_key))
    USING v_now, p_ids, p_limit, p_worker, p_lease_ms;
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
    -- a negative margin, or a moment at infinity or later than the database clock (which
    -- decisions are made at), would delete rows a window still reads
    IF p_margin IS NULL OR p_margin < interval '0' OR NOT isfinite(v_now) OR v_now > clock_timestamp() THEN
        RAISE EXCEPTION 'prune: the margin must not be negative and the moment must be finite and not later than'
            ' the database clock (margin %, at %)', p_margin, v_now USING ERRCODE = 'GV003';
    END IF;
    IF p_batch IS NULL OR p_batch < 0 THEN
        RAISE EXCEPTION 'prune: the batch must be a count of rows, not %', p_batch USING ERRCODE = 'GV003';
    END IF;
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
    IF p_keep IS NULL OR p_keep < interval '0' OR NOT isfinite(v_cut) OR p_now > clock_timestamp() THEN
        RAISE EXCEPTION 'prune: the history kept must not be negative and the moment must be finite and not later'
            ' than the database clock (keep %, at %)', p_keep, coalesce(p_now, clock_timestamp())
            USING ERRCODE = 'GV003';
    END IF;
    IF p_batch IS NULL OR p_batch < 0 THEN
        RAISE EXCEPTION 'prune: the batch must be a count of rows, not %', p_batch USING ERRCODE = 'GV003';
    END IF;
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

-- Messages of tiers a new policy removes: per tier, how many are held (waiting in
-- gov.deferred) and how many are queued for delivery (outbox rows not yet finished).
-- With p_drop, they are ended now, logged like any suppression (blocked_by
-- 'tier_removed', action 'drop'): a held message ends dropped, a queued outbox row
-- ends failed with that reason, never sent. Runs inside `gov policy apply`'s
-- transaction, after the policy lock.
CREATE OR REPLACE FUNCTION gov.retire_tiers_v1(p_tiers text[], p_drop boolean, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (tier text, held bigint, queued bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_tiers IS NULL OR array_position(p_tiers, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'retire tiers: name each tier (got %)', p_tiers USING ERRCODE = 'GV003';
    END IF;
    -- an exempt tier's messages are never suppressed (invariant 4): they wait for delivery
    IF p_drop AND EXISTS (SELECT 1 FROM gov.tiers t WHERE t.tier = ANY (p_tiers) AND t.exempt) THEN
        RAISE EXCEPTION 'retire tiers: % is exempt; its messages are never dropped (remove it once they are delivered)',
            (SELECT string_agg(t.tier, ', ' ORDER BY t.tier) FROM gov.tiers t WHERE t.tier = ANY (p_tiers) AND t.exempt)
            USING ERRCODE = 'GV003';
    END IF;
    RETURN QUERY
    SELECT t.tier,
           (SELECT count(*) FROM gov.deferred d WHERE d.tier = t.tier AND d.state = 'waiting'),
           (SELECT count(*) FROM gov.outbox o
              JOIN gov.messages m ON m.user_id = o.user_id AND m.message_id = o.message_id
             WHERE m.tier = t.tier AND o.state IN ('pending', 'sending'))
      FROM unnest(p_tiers) t(tier)
     ORDER BY 1;
    IF NOT p_drop THEN
        RETURN;
    END IF;

    WITH gone AS (
        UPDATE gov.deferred d
           SET state = 'dropped', outcome = 'tier_removed', finished_at = v_now
         WHERE d.tier = ANY (p_tiers) AND (d.state = 'waiting'
               OR (d.state = 'collapsed' AND d.outcome = 'collapsed'
                   AND EXISTS (SELECT 1 FROM gov.deferred c
                                WHERE c.user_id = d.user_id AND c.message_id = d.collapsed_into
                                  AND c.state = 'waiting')))
        RETURNING d.user_id, d.message_id
    ), verdict AS (
        UPDATE gov.messages m SET action = 'drop', reason = 'tier_removed'
          FROM gone WHERE m.user_id = gone.user_id AND m.message_id = gone.message_id
        RETURNING m.*
    )
    INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action, campaign_id, topic,
                                       blocked_scope, created_at)
    SELECT v.user_id, v.message_id, v.tier, 'tier_removed', 'drop', v.campaign_id, v.topic, 'policy', v_now
      FROM verdict v;

    WITH queued AS (
        UPDATE gov.outbox o
           SET state = 'failed', lease_until = NULL, last_error = 'tier_removed', finished_at = v_now
          FROM gov.messages m
         WHERE m.user_id = o.user_id AND m.message_id = o.message_id AND m.tier = ANY (p_tiers)
           AND o.state IN ('pending', 'sending')
        RETURNING m.user_id, m.message_id, m.tier, m.campaign_id, m.topic
    )
    INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action, campaign_id, topic,
                                       blocked_scope, created_at)
    SELECT DISTINCT q.user_id, q.message_id, q.tier, 'tier_removed', 'drop', q.campaign_id, q.topic, 'policy', v_now
      FROM queued q;
END;
$$;

-- `gov segments refresh`: set gov.users.segment from the policy's [segments] rules, as
-- of p_now, for every user with a subscription (live or retired) or a decision, in one
-- statement (user rows are created as needed). With the rules in gov.settings:
--   engaged  a click (gov.push_events, event 'click') within segment_engaged_ms
--   dormant  no click within segment_dormant_ms, and known to gov at least that long
--            (first subscription or first decision, whichever came first): a user who
--            never clicked but subscribed 30+ days ago is dormant
--   casual   everyone else (a newcomer who has not clicked yet, say)
-- Only events and subscriptions up to p_now count, so a replay at an explicit clock
-- classifies as it would have then. A user whose segment the app set to a name of its
-- own (anything but engaged, casual, dormant) is left alone: the app owns that user's
-- segment until it sets it back to none (NULL). Returns per rule-based segment the
-- users now in it and how many of them changed.
-- PL/pgSQL in steps (classify, then upsert): on a Citus cluster a SQL function's parameters,
-- and a lateral join to a CTE, cannot be planned into a query on a distributed table.
CREATE OR REPLACE FUNCTION gov.refresh_segments_v1(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (segment text, users bigint, changed bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_rows jsonb;
BEGIN
    IF NOT isfinite(p_now) THEN  -- at infinity every user is dormant
        RAISE EXCEPTION 'segments: the moment must be finite, not %', p_now USING ERRCODE = 'GV003';
    END IF;
    -- Classify first, then write: on a Citus cluster what reads gov's tables runs on the
    -- shards (MATERIALIZED), the classification on its rows, and the upsert per shard.
    WITH clock AS (
        SELECT coalesce(p_now, clock_timestamp()) AS t,
               coalesce((SELECT s.segment_engaged_ms FROM gov.settings s), 604800000) AS engaged_ms,
               coalesce((SELECT s.segment_dormant_ms FROM gov.settings s), 2592000000) AS dormant_ms
    ),
    known AS MATERIALIZED (
        SELECT k.user_id, min(k.since) AS since
          FROM (SELECT s.user_id, s.created_at AS since FROM gov.subscriptions s
                UNION ALL
                SELECT m.user_id, min(m.decided_at) FROM gov.messages m GROUP BY m.user_id) k
         CROSS JOIN clock
         WHERE k.since <= clock.t
         GROUP BY k.user_id
    ),
    last_click AS MATERIALIZED (
        SELECT e.user_id, max(e.created_at) AS at
          FROM gov.push_events e CROSS JOIN clock
         WHERE e.event = 'click' AND e.created_at <= clock.t
         GROUP BY e.user_id
    ),
    old AS MATERIALIZED (
        SELECT u.user_id, u.segment FROM gov.users u
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object('user_id', c.user_id, 'old_segment', c.old_segment,
                                                  'segment', c.segment)), '[]')
      INTO v_rows
      FROM (SELECT k.user_id, old.segment AS old_segment,
                   CASE WHEN lc.at > clock.t - clock.engaged_ms * interval '1 millisecond' THEN 'engaged'
                        WHEN coalesce(lc.at, k.since) <= clock.t - clock.dormant_ms * interval '1 millisecond'
                             THEN 'dormant'
                        ELSE 'casual' END AS segment
              FROM known k
             CROSS JOIN clock
              LEFT JOIN last_click lc ON lc.user_id = k.user_id
              LEFT JOIN old ON old.user_id = k.user_id
             WHERE old.segment IS NULL OR old.segment IN ('engaged', 'casual', 'dormant')) c;

    INSERT INTO gov.users AS u (user_id, segment)
    SELECT c.user_id, c.segment FROM jsonb_to_recordset(v_rows) AS c (user_id text, segment text)
    ON CONFLICT (user_id) DO UPDATE
       SET segment = excluded.segment,
           -- excluded.updated_at is the insert's default (clock_timestamp()): Citus admits
           -- no volatile call in DO UPDATE SET
           updated_at = CASE WHEN u.segment IS DISTINCT FROM excluded.segment
                             THEN excluded.updated_at ELSE u.updated_at END
     WHERE u.segment IS NULL OR u.segment IN ('engaged', 'casual', 'dormant');

    RETURN QUERY
    SELECT c.segment, count(*), count(*) FILTER (WHERE c.old_segment IS DISTINCT FROM c.segment)
      FROM jsonb_to_recordset(v_rows) AS c (user_id text, old_segment text, segment text)
     GROUP BY c.segment
     ORDER BY c.segment;
END;
$$;

-- Record one event: display, click, close or unsubscribe from the service worker, or
-- accepted from a sender that delivers outside gov. Refused (SQLSTATE GV003, naming
-- the ids) when the event is unknown, when gov never decided that message for that user
-- or suppressed it (it was never sent), or when the subscription is not the user's.
-- True when recorded, false when it already was (idempotent).
CREATE OR REPLACE FUNCTION gov.record_event_v1(
    p_user_id         text,
    p_message_id      text,
    p_event           text,
    p_subscription_id bigint      DEFAULT NULL,
    p_at              timestamptz DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_allowed boolean;
    v_id      bigint;
BEGIN
    IF p_event IS NULL OR p_event NOT IN ('accepted', 'display', 'click', 'close', 'unsubscribe') THEN
        RAISE EXCEPTION 'unknown event % for message % of user % (expected accepted, display, click, close or unsubscribe)',
            coalesce(quote_literal(left(p_event, 64)), 'NULL'), left(p_message_id, 64), left(p_user_id, 64)
            USING ERRCODE = 'GV003';
    END IF;
    IF NOT isfinite(p_at) THEN  -- an event at infinity would count in every later report
        RAISE EXCEPTION 'an event''s moment must be finite, not %', p_at USING ERRCODE = 'GV003';
    END IF;
    SELECT m.allowed INTO v_allowed
      FROM gov.messages m WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown message % for user %: gov decided no such message', p_message_id, p_user_id
            USING ERRCODE = 'GV003';
    END IF;
    IF NOT v_allowed THEN
        RAISE EXCEPTION 'message % for user % was suppressed, never sent: no % can follow it',
            p_message_id, p_user_id, p_event
            USING ERRCODE = 'GV003';
    END IF;
    IF p_subscription_id IS NOT NULL THEN
        PERFORM 1 FROM gov.subscriptions s WHERE s.id = p_subscription_id AND s.user_id = p_user_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'subscription % is not one of user %''s (message %)',
                p_subscription_id, p_user_id, p_message_id
                USING ERRCODE = 'GV003';
        END IF;
    END IF;
    INSERT INTO gov.push_events (user_id, message_id, subscription_id, event, created_at)
    VALUES (p_user_id, p_message_id, p_subscription_id, p_event, coalesce(p_at, clock_timestamp()))
    ON CONFLICT ON CONSTRAINT push_events_once DO NOTHING
    RETURNING id INTO v_id;
    RETURN v_id IS NOT NULL;
END;
$$;

-- The click rate by local hour of day of every user (segment NULL) and of each segment
-- with data: 24 rows each, hour 0 to 23. click_rate is the raw rate (NULL without a
-- display), estimate the beta-binomial posterior mean with p_strength pseudo-displays
-- of the level above: an hour of all users is shrunk toward all users' overall rate, an
-- hour of a segment toward all users' estimate for that hour. An hour with no data gets
-- the level above's value; one with thousands of displays its own. NULL estimates: no
-- display at all in the window.
CREATE OR REPLACE FUNCTION gov.hour_curves_v1(
    p_since    interval         DEFAULT '56 days',
    p_now      timestamptz      DEFAULT NULL,
    p_strength double precision DEFAULT 20
) RETURNS TABLE (segment text, hour integer, displays bigint, clicks bigint,
                 click_rate double precision, estimate double precision)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    -- (NaN sorts above every number in PostgreSQL: "> 0" alone lets it and infinity in)
    IF p_strength IS NULL OR NOT p_strength > 0 OR NOT p_strength < 'Infinity'::double precision THEN
        RAISE EXCEPTION 'hour curves: the prior strength must be a positive number of displays, not %',
            coalesce(p_strength::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH d AS (
        SELECT * FROM gov.display_hours(p_since, coalesce(p_now, clock_timestamp()))
    ), hours AS (
        SELECT h::integer AS hour FROM generate_series(0, 23) h
    ), overall AS (
        SELECT sum(d.clicks)::double precision / nullif(sum(d.displays), 0) AS rate FROM d
    ), everyone AS (
        SELECT h.hour, coalesce(sum(d.displays), 0)::bigint AS displays, coalesce(sum(d.clicks), 0)::bigint AS clicks
          FROM hours h LEFT JOIN d ON d.hour = h.hour GROUP BY h.hour
    ), everyone_est AS (
        SELECT e.hour, e.displays, e.clicks,
               e.clicks::double precision / nullif(e.displays, 0) AS click_rate,
               (e.clicks + p_strength * o.rate) / (e.displays + p_strength) AS estimate
          FROM everyone e CROSS JOIN overall o
    ), segments AS (
        SELECT s.segment, h.hour,
               coalesce(sum(d.displays), 0)::bigint AS displays, coalesce(sum(d.clicks), 0)::bigint AS clicks
          FROM (SELECT DISTINCT d.segment FROM d WHERE d.segment IS NOT NULL) s
         CROSS JOIN hours h
          LEFT JOIN d ON d.segment = s.segment AND d.hour = h.hour
         GROUP BY s.segment, h.hour
    )
    SELECT NULL::text, e.hour, e.displays, e.clicks, e.click_rate, e.estimate FROM everyone_est e
    UNION ALL
    SELECT s.segment, s.hour, s.displays, s.clicks, s.clicks::double precision / nullif(s.displays, 0),
           (s.clicks + p_strength * e.estimate) / (s.displays + p_strength)
      FROM segments s JOIN everyone_est e ON e.hour = s.hour
     ORDER BY 1 NULLS FIRST, 2;
END;
$$;

-- The marginal fatigue measure (docs/analysts.md): what the n-th send of a week costs and
-- earns, per send, overall and per segment, for the sends accepted in the window
-- (p_now - p_since, p_now]. Definitions:
--   send         a message a push service accepted for the user (the 'accepted' event;
--                one message on two browsers is one send), at its first acceptance
--   position     the user's sends accepted in the 7 days before it (0: the first of the
--                week; sends before the window count, so positions are right at its start)
--   clicked      the send drew a click (by p_now)
--   unsubscribed the user's first unsubscribe (by p_now) is charged to one send: the one
--                the event names if it is an accepted send at or before it, else the last
--                send before it. Sends after the charged one are left out (a user who left
--                can neither click nor leave again)
--   segment      gov.users.segment (through gov.user_segments, which analysts may read);
--                '(none)' for users without one; '*' is every user
--   groups       positions ascending, merged upward until a group holds p_min_sends
--                sends; a last group short of it joins the one before
--   rates        clicks / sends and unsubscribes / sends, each with its 95 % Wilson interval
--   difference_low  the one-sided 95 % lower bound of unsubscribe rate - click rate
--                (Newcombe's hybrid score interval from the two rates' 90 % Wilson bounds:
--                "unsubscribes exceed clicks" is a one-sided claim)
--   crossover    true on one group per segment: where the unsubscribe rate overtakes the
--                click rate for good. The intervals must say so: some group's difference_low
--                is above 0 (the first such group confirms it); the crossover is the first
--                group of the unbroken run of groups whose unsubscribe rate exceeds their
--                click rate that ends at the confirming group
--   verdict      per segment: 'crossover'; 'not enough data' when some group's unsubscribe
--                rate exceeds its click rate but no bound confirms it (more_sends: how many
--                more sends at the same rates would, for the nearest such group);
--                'not reached' when no group's does
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (#variable_conflict lets the columns keep the output columns' names).
CREATE OR REPLACE FUNCTION gov.fatigue_marginal_v1(
    p_since     interval    DEFAULT '28 days',
    p_now       timestamptz DEFAULT NULL,
    p_min_sends integer     DEFAULT 800
) RETURNS TABLE (
    segment          text,
    group_no         integer,
    position_from    integer,
    position_to      integer,
    sends            bigint,
    clicks           bigint,
    unsubscribes     bigint,
    click_rate       numeric,
    click_low        numeric,
    click_high       numeric,
    unsubscribe_rate numeric,
    unsubscribe_low  numeric,
    unsubscribe_high numeric,
    difference_low   numeric,
    crossover        boolean,
    verdict          text,
    more_sends       bigint
)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_positions jsonb;
BEGIN
    IF p_min_sends IS NULL OR p_min_sends < 0 THEN
        RAISE EXCEPTION 'fatigue: the sends a group holds at least must be a count, not %',
            coalesce(p_min_sends::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    -- Two statements: the sends per position from the events first, then the merging walk
    -- (a recursive CTE) over those few rows alone; on a Citus cluster a recursive CTE may
    -- not share a statement with the distributed tables.
        WITH bounds AS (
            SELECT b.t_end - p_since AS t_start, b.t_end
              FROM (SELECT coalesce(p_now, clock_timestamp()) AS t_end) b
        ),
        -- (what reads gov's tables is MATERIALIZED: on a Citus cluster each runs on the
        -- shards and the rest on its few rows, with no subquery reaching back to a shard)
        accepted AS MATERIALIZED (
            SELECT e.user_id, e.message_id, min(e.created_at) AS at
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'accepted' AND e.created_at > w.t_start - interval '7 days' AND e.created_at <= w.t_end
             GROUP BY e.user_id, e.message_id
        ),
        numbered AS (
            SELECT a.user_id, a.message_id, a.at,
                   row_number() OVER (PARTITION BY a.user_id ORDER BY a.at, a.message_id) AS rn,
                   count(*) OVER (PARTITION BY a.user_id ORDER BY a.at
                                  RANGE BETWEEN UNBOUNDED PRECEDING AND interval '7 days' PRECEDING) AS aged
              FROM accepted a
        ),
        left_at AS MATERIALIZED (
            SELECT DISTINCT ON (e.user_id) e.user_id, e.message_id, e.created_at AS at
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'unsubscribe' AND e.created_at <= w.t_end
             ORDER BY e.user_id, e.created_at, e.id
        ),
        clicked AS MATERIALIZED (
            SELECT DISTINCT e.user_id, e.message_id
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'click' AND e.created_at <= w.t_end
        ),
        segments AS MATERIALIZED (
            SELECT u.user_id, u.segment FROM gov.user_segments u
        ),
        charged AS (  -- the unsubscribed message's number, else the last before leaving, else 0
            SELECT l.user_id,
                   coalesce(max(n.rn) FILTER (WHERE n.message_id = l.message_id), max(n.rn), 0) AS rn
              FROM left_at l
              LEFT JOIN numbered n ON n.user_id = l.user_id AND n.at <= l.at
             GROUP BY l.user_id
        ),
        counted AS (
            SELECT coalesce(u.segment, '(none)') AS segment,
                   (n.rn - 1 - n.aged)::integer AS position,
                   k.user_id IS NOT NULL AS clicked,
                   coalesce(n.rn = c.rn, false) AS unsubscribed
              FROM numbered n CROSS JOIN bounds w
              LEFT JOIN clicked k ON k.user_id = n.user_id AND k.message_id = n.message_id
              LEFT JOIN charged c ON c.user_id = n.user_id
              LEFT JOIN segments u ON u.user_id = n.user_id
             WHERE n.at > w.t_start AND (c.rn IS NULL OR n.rn <= c.rn)
        ),
        per_position AS (
            SELECT k.segment, k.position, k.sends, k.clicks, k.unsubscribes,
                   row_number() OVER (PARTITION BY k.segment ORDER BY k.position) AS ord
              FROM (SELECT coalesce(c.segment, '*') AS segment, c.position, count(*) AS sends,
                           count(*) FILTER (WHERE c.clicked) AS clicks,
                           count(*) FILTER (WHERE c.unsubscribed) AS unsubscribes
                      FROM counted c
                     GROUP BY GROUPING SETS ((c.segment, c.position), (c.position))) k
        )
        SELECT coalesce(jsonb_agg(to_jsonb(pp)), '[]') INTO v_positions FROM per_position pp;

    RETURN QUERY
        WITH RECURSIVE per_position AS (
            SELECT * FROM jsonb_to_recordset(v_positions)
                       AS (segment text, position integer, sends bigint, clicks bigint, unsubscribes bigint, ord bigint)
        ),
        walk AS (  -- merge upward: a group closes once it holds p_min_sends sends
            SELECT p.segment, p.ord, 1 AS group_no, p.sends AS held
              FROM per_position p WHERE p.ord = 1
            UNION ALL
            SELECT p.segment, p.ord,
                   w.group_no + CASE WHEN w.held >= p_min_sends THEN 1 ELSE 0 END,
                   CASE WHEN w.held >= p_min_sends THEN p.sends ELSE w.held + p.sends END
              FROM walk w JOIN per_position p ON p.segment = w.segment AND p.ord = w.ord + 1
        ),
        walked AS (
            SELECT p.*, w.group_no, max(w.group_no) OVER (PARTITION BY p.segment) AS last_group,
                   sum(p.sends) OVER (PARTITION BY p.segment, w.group_no) AS group_sends
              FROM per_position p JOIN walk w ON w.segment = p.segment AND w.ord = p.ord
        ),
        grouped AS (  -- a last group short of p_min_sends joins the one before
            SELECT g.segment, g.group_no::integer AS group_no, min(g.position) AS position_from,
                   max(g.position) AS position_to, sum(g.sends)::bigint AS sends,
                   sum(g.clicks)::bigint AS clicks, sum(g.unsubscribes)::bigint AS unsubscribes
              FROM (SELECT x.segment, x.position, x.sends, x.clicks, x.unsubscribes,
                           CASE WHEN x.group_no = x.last_group AND x.group_sends < p_min_sends AND x.last_group > 1
                                THEN x.group_no - 1 ELSE x.group_no END AS group_no
                      FROM walked x) g
             GROUP BY g.segment, g.group_no
        ),
        rated AS (
            SELECT g.*, g.clicks::double precision / g.sends AS pc, g.unsubscribes::double precision / g.sends AS pu,
                   ci.low AS c_low, ci.high AS c_high, ui.low AS u_low, ui.high AS u_high,
                   gov.difference_low_v1(g.unsubscribes, g.clicks, g.sends, 1.6448536269514722) AS d_low,
                   g.unsubscribes > g.clicks AS above
              FROM grouped g
             CROSS JOIN LATERAL gov.wilson_interval_v1(g.clicks, g.sends) ci
             CROSS JOIN LATERAL gov.wilson_interval_v1(g.unsubscribes, g.sends) ui
        ),
        tested AS (
            SELECT r.*,
                   CASE WHEN r.above AND NOT r.d_low > 0
                        THEN gov.sends_to_decide_v1(r.unsubscribes, r.clicks, r.sends, 1.6448536269514722) END AS short_by
              FROM rated r
        ),
        confirmed AS (
            SELECT t.*, min(t.group_no) FILTER (WHERE t.d_low > 0) OVER (PARTITION BY t.segment) AS first_sure
              FROM tested t
        ),
        located AS (
            SELECT c.*,
                   CASE WHEN c.first_sure IS NOT NULL THEN
                       coalesce(max(c.group_no) FILTER (WHERE NOT c.above AND c.group_no < c.first_sure)
                                    OVER (PARTITION BY c.segment), 0) + 1 END AS crossing,
                   bool_or(c.above) OVER (PARTITION BY c.segment) AS any_above,
                   min(c.short_by) OVER (PARTITION BY c.segment) AS fewest_short
              FROM confirmed c
        )
        SELECT l.segment, l.group_no, l.position_from, l.position_to, l.sends, l.clicks, l.unsubscribes,
               round(l.pc::numeric, 6), round(l.c_low::numeric, 6), round(l.c_high::numeric, 6),
               round(l.pu::numeric, 6), round(l.u_low::numeric, 6), round(l.u_high::numeric, 6),
               round(l.d_low::numeric, 6),
               coalesce(l.group_no = l.crossing, false),
               CASE WHEN l.crossing IS NOT NULL THEN 'crossover'
                    WHEN l.any_above THEN 'not enough data'
                    ELSE 'not reached' END,
               CASE WHEN l.crossing IS NULL AND l.any_above THEN l.fewest_short END
          FROM located l
         ORDER BY l.segment = '*' DESC, l.segment, l.group_no;
END;
$$;

-- How many more sends, at the same rates, before gov.difference_low_v1 rises above 0: the
-- smallest m for which the counts scaled to p_sends + m confirm it (bisection). NULL when
-- the unsubscribe rate is not above the click rate (no amount of data would confirm it),
-- 0 when it is confirmed already.
CREATE OR REPLACE FUNCTION gov.sends_to_decide_v1(
    p_unsubscribes bigint,
    p_clicks       bigint,
    p_sends        bigint,
    p_z            double precision DEFAULT 1.959963984540054
) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_pu  double precision;
    v_pc  double precision;
    v_lo  bigint := 0;  -- not enough (or none needed)
    v_hi  bigint := 1;  -- enough
    v_mid bigint;
BEGIN
    -- (a negative p_z is no confidence level: NULL, as gov.wilson_interval_v1 gives)
    IF p_sends IS NULL OR p_sends <= 0 OR p_unsubscribes <= p_clicks OR p_z IS NULL OR NOT p_z >= 0
       OR NOT p_z < 'Infinity'::double precision THEN
        RETURN NULL;
    END IF;
    IF gov.difference_low_v1(p_unsubscribes, p_clicks, p_sends, p_z) > 0 THEN
        RETURN 0;
    END IF;
    v_pu := p_unsubscribes::double precision / p_sends;
    v_pc := p_clicks::double precision / p_sends;
    WHILE NOT gov.difference_low_v1(v_pu * (p_sends + v_hi), v_pc * (p_sends + v_hi), p_sends + v_hi, p_z) > 0 LOOP
        v_lo := v_hi;
        v_hi := v_hi * 2;
    END LOOP;
    WHILE v_hi - v_lo > 1 LOOP
        v_mid := (v_lo + v_hi) / 2;
        IF gov.difference_low_v1(v_pu * (p_sends + v_mid), v_pc * (p_sends + v_mid), p_sends + v_mid, p_z) > 0 THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN v_hi;
END;
$$;
