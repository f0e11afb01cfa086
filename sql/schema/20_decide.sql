-- gov: the decision and the send. gov.decide_core (shared with the releaser), the stable
-- gov.decide_v1 and gov.send_v1 (decide, store the content, fan out or hold), campaigns
-- in bulk, and the quiet-hours clock the decision consults.

-- ---------------------------------------------------------------- quiet hours

-- The first moment at or after p_at outside the user's quiet hours (p_at itself when
-- the user has none). Quiet hours apply to users with a time zone: their own window,
-- else the policy's default. Computed in the user's zone by the database, so the
-- window opens at 08:00 local also on the days the clocks change.
CREATE FUNCTION gov.quiet_until(p_user_id text, p_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_tz    text;
    v_start time;
    v_end   time;
    v_local timestamp;
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
    RETURN coalesce(gov.local_instant(v_local::date + v_end, v_tz, p_at),
                    gov.local_instant(v_local::date + 1 + v_end, v_tz, p_at));
END;
$$;

-- The earliest instant after p_after at which the wall clock in p_tz reads p_local, or
-- jumps past it (NULL when none of the candidates does). AT TIME ZONE names one instant;
-- the answer is at most two hours before it (the largest shift a zone makes, that of
-- Antarctica/Troll), on a quarter-hour step (every shift is a multiple of 15 minutes):
-- * a local time in the hour repeated when the clocks go back names two instants, and
--   AT TIME ZONE gives the later one: the earlier one reads the same local time;
-- * a local time skipped when the clocks go forward (02:30 on a spring night in Berlin)
--   is read as if the clocks had not changed, an hour late (03:30): the first instant
--   after the gap (03:00) reads past it where the quarter before read short of it.
-- (An outside probe compared gov.quiet_until with a minute-by-minute model in zoneinfo:
-- quiet hours ended 15 minutes to 2 hours late on such nights.)
-- (PL/pgSQL, not SQL: a SQL function with a FROM clause is not inlined, so its statement
-- was planned again on every call, 0.25 against 0.12 ms by pgbench; migration 0052.)
CREATE FUNCTION gov.local_instant(p_local timestamp, p_tz text, p_after timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT min(c.at)
              FROM (SELECT (p_local AT TIME ZONE p_tz) - k * interval '15 minutes' AS at
                      FROM generate_series(0, 8) k) c
             WHERE c.at > p_after
               AND ((c.at AT TIME ZONE p_tz) = p_local
                    OR ((c.at AT TIME ZONE p_tz) > p_local
                        AND ((c.at - interval '15 minutes') AT TIME ZONE p_tz) < p_local)));
END;
$$;

-- ---------------------------------------------------------------- the policy, as the decision reads it

-- The decision's reads of the policy tables, one small SQL function each, which
-- PostgreSQL inlines into the statement that calls it. On one server they read the
-- tables. On a Citus cluster the policy tables are reference tables, and a statement that
-- names one is planned again by Citus on every call (its shard query deparsed, parsed and
-- planned: docs/scale-out.md, "Where a delegated decision's time goes"); gov.distribute_v1
-- binds these functions to the tables' local copies instead (every node holds a reference
-- table's one shard, under the same name), which PostgreSQL plans once per session like any
-- table. Reads only: a write to a copy would bypass Citus's replication. Where a node holds
-- no copies, the functions read the Citus tables in PL/pgSQL (p_citus): Citus refuses a
-- parameterised SQL function over its tables. One text, this function, for every binding.
CREATE FUNCTION gov.bind_policy_reads(p_tiers text, p_caps text, p_rules text, p_citus boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $bind$
DECLARE
    v_def text;
    v_fn  record;
BEGIN
    FOR v_fn IN
        SELECT * FROM (VALUES
            -- a tier's row
            ('gov.policy_tier(p_tier text)', 'SETOF gov.tiers',
             format('SELECT * FROM %s t WHERE t.tier = p_tier', p_tiers)),
            -- the caps of a scope (and topic)
            ('gov.policy_caps(p_scope text, p_topic text)', 'SETOF gov.caps',
             format('SELECT * FROM %s c WHERE c.scope = p_scope AND c.topic = p_topic', p_caps)),
            -- the compiled rules of one (tier, topic, segment) group
            ('gov.policy_rules(p_tier text, p_topic text, p_segment text)', 'SETOF gov.compiled_rules',
             format('SELECT * FROM %s r WHERE r.tier = p_tier AND r.topic = p_topic AND r.segment = p_segment',
                    p_rules)),
            -- the budgets an allowed message of p_tier spends in (any segment's: a change of
            -- segment finds the history it needs); p_topic_key is the rules' topic ('', '*', the topic)
            ('gov.policy_spend(p_tier text, p_topic_key text, p_topic text)', 'SETOF text',
             format('SELECT DISTINCT CASE WHEN r.scope = ''topic'' THEN ''topic:'' || p_topic ELSE r.budget END'
                    ' FROM %s r WHERE r.tier = p_tier AND r.topic = p_topic_key', p_rules))
        ) f(signature, result, query)
    LOOP
        IF p_citus THEN
            v_def := format('LANGUAGE plpgsql STABLE AS %L', 'BEGIN RETURN QUERY ' || v_fn.query || '; END');
        ELSE
            v_def := format('LANGUAGE sql STABLE AS %L', v_fn.query);
        END IF;
        EXECUTE format('CREATE OR REPLACE FUNCTION %s RETURNS %s %s', v_fn.signature, v_fn.result, v_def);
    END LOOP;
END;
$bind$;

SELECT gov.bind_policy_reads('gov.tiers', 'gov.caps', 'gov.compiled_rules');

-- ---------------------------------------------------------------- the decision

-- The user's lock beyond this node, taken by the decision after its advisory lock. On one
-- server there is nothing beyond it: the advisory lock is the user's lock, and this is a
-- no-op the planner inlines. On a Citus cluster gov.distribute_v1 replaces it with a lock
-- on the user's gov.users row, which lives in one shard whichever node asks for it: an
-- advisory lock is only the lock of the node that takes it, and a decision made inside
-- the app's own transaction runs on the coordinator while a delegated one runs on the
-- worker, so their advisory locks never meet (tests/citus: the mixed race).
CREATE FUNCTION gov.cluster_user_lock(p_user_id text) RETURNS void
LANGUAGE sql AS $$
    SELECT NULL::void
$$;

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
CREATE FUNCTION gov.decide_core(
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

-- The decision (stable surface): see gov.decide_core. Lock choice: a transaction-scoped
-- advisory lock on a 64-bit hash of the user id (hashtextextended; hashtext() collides,
-- WEBPUSH.md). Measured against a row lock on a gov.users row (INSERT … ON CONFLICT DO
-- NOTHING, then FOR UPDATE) with `gov bench --lock both --rounds 3`, 8 connections:
-- fresh 1,882 vs 1,823 and 1,906 vs 1,974 decisions/s, mixed 2,449 vs 2,347 and 1,931
-- vs 1,875 (advisory vs row, two runs): no difference above the noise, and both exact
-- in 50/50 rounds of the 20-way race. The advisory lock wins on what it does not do: it
-- needs no user row and writes no tuple per decision. docs/performance.md has the rest.
CREATE OR REPLACE FUNCTION gov.decide_v1(
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
-- PL/pgSQL, not SQL: before PostgreSQL 18 a SQL function's statement is planned again on
-- every call, 15-20 % of a decision on PostgreSQL 15 (pgbench, docs/performance.md).
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, p_now, false);
END;
$$;

-- ---------------------------------------------------------------- the send

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

-- One outbox row per live endpoint of the user, for an allowed message. PL/pgSQL, not
-- SQL: Citus cannot plan a SQL function's parameters into a query on a distributed table.
CREATE FUNCTION gov.fan_out(p_user_id text, p_message_id text, p_now timestamptz) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
BEGIN
    WITH fan AS (
        INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
        SELECT p_user_id, p_message_id, s.id, p_now, p_now
          FROM gov.subscriptions s
         WHERE s.user_id = p_user_id AND s.retired_at IS NULL
         ORDER BY s.id
        RETURNING id
    )
    SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_ids FROM fan;
    RETURN v_ids;
END;
$$;

-- ---------------------------------------------------------------- campaigns in bulk

-- The plain ones among users already locked, each with its own message id: those
-- gov.decide_together can decide at p_now, with no earlier verdict for their message and,
-- unless the tier is exempt, outside their quiet hours at p_now (gov.quiet_until, the
-- clock gov.decide_core consults: a time zone changes a decision only through it), no
-- caps of their own and no opt-out of the topic (a segment with windows of its own is
-- plain: gov.decide_together reads each user's group of rules). An empty or NULL id is
-- never plain (gov.decide_core refuses it). The tier must exist.
-- Users come back in the order given.
CREATE FUNCTION gov.plain_users(p_users text[], p_message_ids text[], p_tier text, p_topic text,
                                p_now timestamptz) RETURNS text[]
LANGUAGE plpgsql
-- (generic plans, as gov.decide_core: planning the probe for a batch of one cost more than running it)
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_exempt boolean;
BEGIN
    SELECT t.exempt INTO STRICT v_exempt FROM gov.tiers t WHERE t.tier = p_tier;
    -- (The earlier verdict is probed per user, by its key: every row of a campaign's
    -- earlier batches has the campaign's message id, so a join on it would read them all.)
    RETURN ARRAY(
        SELECT x.u FROM unnest(p_users, p_message_ids) WITH ORDINALITY AS x(u, m, n)
          LEFT JOIN LATERAL (SELECT true AS seen FROM gov.messages m
                              WHERE m.user_id = x.u AND m.message_id = x.m LIMIT 1) e ON true
         WHERE x.u <> '' AND x.m <> '' AND e.seen IS NULL
           AND (v_exempt OR (
                    NOT EXISTS (SELECT 1 FROM gov.users u
                                 WHERE u.user_id = x.u
                                   AND u.time_zone IS NOT NULL AND gov.quiet_until(u.user_id, p_now) > p_now)
                AND NOT EXISTS (SELECT 1 FROM gov.user_caps uc WHERE uc.user_id = x.u)
                AND NOT (p_topic IS NOT NULL
                         AND EXISTS (SELECT 1 FROM gov.user_topic_optouts o
                                      WHERE o.user_id = x.u AND o.topic = p_topic))))
         ORDER BY x.n);
END;
$$;

-- A campaign batch's first step on one server: lock every user of the batch (sorted,
-- distinct), in that order, the order every batch uses, so two batches never wait on each
-- other in a cycle (a single send locks one user only); then return the plain ones
-- (gov.plain_users) for the campaign's one message id at p_now.
CREATE FUNCTION gov.lock_batch(p_users text[], p_message_id text, p_tier text, p_topic text,
                               p_now timestamptz) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(x.u, 0))
       FROM unnest(p_users) WITH ORDINALITY AS x(u, n)
      WHERE x.u <> ''
      ORDER BY x.n;
    RETURN gov.plain_users(p_users, array_fill(p_message_id, ARRAY[coalesce(cardinality(p_users), 0)]),
                           p_tier, p_topic, p_now);
END;
$$;

-- Decide one tier's messages for plain users (gov.plain_users: locked, and none of what
-- makes a user's decision their own), each user with their own message id, in one
-- statement, with the verdicts and the message, suppression and send rows
-- gov.decide_core gives each of them: each user's group of rules (their segment's when the
-- policy has one for the tier and topic, else the default ''), every window of every rule
-- counted per user (one
-- range scan per budget over its longest window), the first that blocks in decision
-- order, the moment a slot frees for it. A fraction of a decision's cost per user. A
-- user appears once (a second message of theirs would not see the first's spend).
-- Rows come in no promised order.
CREATE FUNCTION gov.decide_together(
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
    v_spend text[] := '{}';
    v_segmented boolean := false;
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
    -- What an allowed message spends, as gov.decide_core writes it, and whether any segment
    -- has rules of its own here (else every user reads group '', unasked).
    IF NOT v_tier.exempt THEN
        SELECT ARRAY(SELECT DISTINCT CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END
                       FROM gov.compiled_rules r
                      WHERE r.tier = p_tier AND r.topic = v_topic),
               EXISTS (SELECT 1 FROM gov.compiled_rules r
                        WHERE r.tier = p_tier AND r.topic = v_topic AND r.segment <> '')
          INTO v_spend, v_segmented;
    END IF;
    RETURN QUERY
    WITH keyed AS (  -- each user's group of rules, as gov.decide_core chooses it
        SELECT p.u, coalesce(g.seg, '') AS seg
          FROM unnest(p_users) p(u)
          LEFT JOIN LATERAL (SELECT u.segment AS seg FROM gov.users u
                              WHERE v_segmented AND u.user_id = p.u
                                AND EXISTS (SELECT 1 FROM gov.compiled_rules r
                                             WHERE r.tier = p_tier AND r.topic = v_topic
                                               AND r.segment = u.segment)) g ON true
    ), rules AS (
        SELECT r.segment, r.seq, r.scope, r.windows, r.caps,
               CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END AS budget
          FROM gov.compiled_rules r
         WHERE NOT v_tier.exempt AND r.tier = p_tier AND r.topic = v_topic
    ), checked AS (
        SELECT p.u, r.seq, r.scope, r.budget, x.i, x.w, x.c,
               CASE WHEN x.i <= 4 THEN k.counts[x.i]
                    ELSE (SELECT count(*) FROM gov.sends s
                           WHERE s.user_id = p.u AND s.budget = r.budget
                             AND s.sent_at > p_now - x.w * interval '1 millisecond') END AS n
          FROM keyed p
          JOIN rules r ON r.segment = p.seg
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

-- A campaign's form of it: one message id for every user.
CREATE FUNCTION gov.decide_together(
    p_users       text[],
    p_message_id  text,
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
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM gov.decide_together(
        p_users, array_fill(p_message_id, ARRAY[coalesce(cardinality(p_users), 0)]), p_tier, p_topic,
        p_campaign_id, p_now);
END;
$$;

-- Decide one message for many users in one call and one transaction, with the verdicts
-- and suppression rows one-by-one decisions (gov.decide_core) would give, but one commit
-- for the batch instead of one per user. Callers keep batches modest
-- (gov.Governor.decide_many: 500): every user lock is held until the batch commits, and
-- they share the server's lock table. Rows come in no promised order.
-- On one server the batch's plain users are decided together (gov.lock_batch,
-- gov.decide_together); everyone else, and every user on a Citus cluster, goes through
-- gov.decide_core, in user order.
-- p_shard_key: on a Citus cluster the batch is one shard's users and is decided on the
-- worker that holds them (gov.shard_groups_v1 splits an audience); NULL on one server.
CREATE FUNCTION gov.decide_many_v2(
    p_shard_key   text,
    p_user_ids    text[],
    p_message_id  text,
    p_tier        text,
    p_topic       text        DEFAULT NULL,
    p_campaign_id text        DEFAULT NULL,
    p_now         timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id        text,
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
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_users text[];
    v_plain text[] := '{}';
    r_user  record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    v_users := ARRAY(SELECT DISTINCT u FROM unnest(p_user_ids) u ORDER BY 1);
    -- Bad input (an unknown tier, no message id, an empty user id) is decide_core's to refuse.
    IF p_message_id <> '' AND EXISTS (SELECT 1 FROM gov.tiers t WHERE t.tier = p_tier)
       AND NOT gov.distributed() THEN
        v_plain := gov.lock_batch(v_users, p_message_id, p_tier, p_topic, v_now);
        RETURN QUERY
        SELECT d.user_id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, false
          FROM gov.decide_together(v_plain, p_message_id, p_tier, p_topic, p_campaign_id, v_now) d;
    END IF;
    FOR r_user IN SELECT u AS id FROM unnest(v_users) u WHERE NOT u = ANY (v_plain) OR u IS NULL ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, d.repeated
          FROM gov.decide_core(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;
    END LOOP;
END;
$$;

-- The same for sends: decide, store the content, fan out or hold, per user, with what
-- gov.send_v1 gives each. On one server, for a tier that holds nothing (exempt, or one
-- that drops), the plain users are decided together and their content stored and fanned
-- out in a few statements; a tier that defers or collapses sends everyone through
-- gov.send_v1, as does a Citus cluster. Rows come in no promised order.
CREATE FUNCTION gov.send_many_v2(
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
-- ---------------------------------------------------------------- many messages at once

-- Send a batch of unrelated messages (any users, tiers, topics, content) in one call and
-- one transaction: what `gov serve` does with the requests that arrive together. Each
-- message gets the verdict, rows and fan-out gov.send_v1 would give it alone, one call
-- after the other in user order, then in the order given (ordinal, from 1): a user's
-- later message in the batch sees the earlier one's spend. What the batch saves is the
-- round trip and the durable commit per message (most of an allowed decision's cost),
-- and on one server the per-message work: the messages of users with one message in the
-- batch, plain ones (gov.plain_users), are decided together, per tier, topic and campaign,
-- by gov.decide_together, their content stored and fanned out in a few statements; the
-- rest go through gov.send_v1, as does everything on a Citus cluster. In a tier that
-- holds (defer, collapse) a user is plain only with nothing held (no waiting row: then
-- gov.send_v1's gov.release_owed and gov.absorb_group have nothing to do), and a message
-- decided together but blocked is held by gov.hold as gov.send_v1 holds it, in the
-- one-by-one loop's place (user order: holds compete for release minutes in that order),
-- so it gets the same rows and the same final verdict. Every user of the batch is locked
-- first, in user order, the order every batch uses, so batches never wait on each other
-- in a cycle. An error in any message (an unknown tier, say) fails the whole call and
-- nothing is written: the caller then sends each message alone, so the error stays with
-- its message (gov.aio.AsyncGovernor.send_batch). p_shard_key: on a Citus cluster, one
-- shard's messages decided on the worker that holds them (gov.shard_groups_v1); NULL on
-- one server. Rows come in no promised order.
CREATE FUNCTION gov.send_batch_v1(
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
    v_hold  integer[] := '{}';
    r_group record;
    r_msg   record;
    r_held  record;
    v_plain text[];
    v_m     record;
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
            SELECT msg.t, msg.tp, msg.c, t.exempt OR t.on_exceed = 'drop' AS final,
                   array_agg(msg.u ORDER BY msg.u) AS us, array_agg(msg.m ORDER BY msg.u) AS ms
              FROM msg JOIN gov.tiers t ON t.tier = msg.t
             WHERE msg.mine = 1 AND msg.u <> '' AND msg.m <> ''
               AND length(msg.u) <= 256 AND length(msg.m) <= 256
               AND (p_ttls[msg.n] IS NULL OR p_ttls[msg.n] BETWEEN 1 AND 2419200)
               AND gov.content_ok(p_contents[msg.n])
               AND (t.exempt OR t.on_exceed = 'drop'
                    OR NOT EXISTS (SELECT 1 FROM gov.deferred d WHERE d.user_id = msg.u AND d.state = 'waiting'))
             GROUP BY msg.t, msg.tp, msg.c, t.exempt, t.on_exceed
            -- (a holding tier's message alone goes through gov.send_v1: pgbench, one message,
            -- 0.71-0.79 ms that way against 0.79-0.85 ms together)
            HAVING t.exempt OR t.on_exceed = 'drop' OR count(*) > 1
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
              FROM decided d
             WHERE d.allowed OR r_group.final;  -- a blocked message of a tier that holds: below
            v_done := v_done || ARRAY(SELECT x.n::integer FROM unnest(p_user_ids) WITH ORDINALITY x(u, n)
                                       WHERE x.u = ANY (v_plain));
            IF NOT r_group.final THEN
                v_hold := v_hold || ARRAY(
                    SELECT x.n::integer FROM unnest(p_user_ids) WITH ORDINALITY x(u, n)
                      JOIN gov.messages m ON m.user_id = x.u AND m.message_id = p_message_ids[x.n]
                     WHERE x.u = ANY (v_plain) AND NOT m.allowed);
            END IF;
        END LOOP;
    END IF;
    FOR r_msg IN
        SELECT x.n::integer AS n, x.u, x.m, x.t, x.tp, x.c, x.ct, x.ck, x.ttl
          FROM unnest(p_user_ids, p_message_ids, p_tiers, p_topics, p_campaign_ids, p_contents,
                      p_collapse_keys, p_ttls) WITH ORDINALITY AS x(u, m, t, tp, c, ct, ck, ttl, n)
         WHERE NOT x.n::integer = ANY (v_done) OR x.n::integer = ANY (v_hold)
         ORDER BY x.u, x.n
    LOOP
        IF r_msg.n = ANY (v_hold) THEN
            -- decided together above and blocked: what gov.send_v1 does after gov.decide_core
            -- (the content is stored; the user has nothing held for the hold to join)
            SELECT m.action, m.reason, m.used, m.cap, m.retry_after_ms, c.expires_at INTO STRICT v_m
              FROM gov.messages m
              JOIN gov.message_content c ON c.user_id = m.user_id AND c.message_id = m.message_id
             WHERE m.user_id = r_msg.u AND m.message_id = r_msg.m;
            SELECT * INTO r_held
              FROM gov.hold(r_msg.u, r_msg.m, r_msg.t, r_msg.ck, v_m.action, v_m.reason, v_m.retry_after_ms,
                            v_m.expires_at, v_now);
            IF r_held.o_action IS DISTINCT FROM v_m.action OR r_held.o_reason IS DISTINCT FROM v_m.reason THEN
                UPDATE gov.messages m SET action = r_held.o_action, reason = r_held.o_reason
                 WHERE m.user_id = r_msg.u AND m.message_id = r_msg.m;
                UPDATE gov.push_suppressions ps SET action = r_held.o_action
                 WHERE ps.user_id = r_msg.u AND ps.message_id = r_msg.m;
            END IF;
            RETURN QUERY SELECT r_msg.n, false, r_held.o_action, r_held.o_reason, v_m.used, v_m.cap,
                                v_m.retry_after_ms, false, '{}'::bigint[];
            CONTINUE;
        END IF;
        RETURN QUERY
        SELECT r_msg.n, s.allowed, s.action, s.reason, s.used, s.cap, s.retry_after_ms, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_msg.u, r_msg.m, r_msg.t, r_msg.tp, r_msg.c, r_msg.ct, r_msg.ck, r_msg.ttl, v_now) s;
    END LOOP;
END;
$$;

-- ---------------------------------------------------------------- released names, kept (invariant 16)

-- gov.decide_many_v1 (migration 0005), replaced by gov.decide_many_v2 (one shard's users
-- per call) in migration 0016: the same decisions, its users split by shard
-- (gov.shard_groups_v1) and each group decided by decide_many_v2 at one moment, the rows
-- in user order as v1 gave them. On a Citus cluster this runs on the coordinator (it has
-- no shard key to be delegated by); decide_many_v2 decides there one user at a time, each
-- under the user's row lock (gov.cluster_user_lock), so the caps hold: slower, not wrong.
CREATE FUNCTION gov.decide_many_v1(
    p_user_ids    text[],
    p_message_id  text,
    p_tier        text,
    p_topic       text DEFAULT NULL,
    p_campaign_id text DEFAULT NULL,
    p_now         timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id        text,
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
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    RETURN QUERY
    SELECT d.user_id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, d.repeated
      FROM gov.shard_groups_v1(p_user_ids) g
     CROSS JOIN LATERAL gov.decide_many_v2(g.shard_key, g.user_ids, p_message_id, p_tier, p_topic,
                                           p_campaign_id, v_now) d
     ORDER BY d.user_id;
END;
$$;

-- gov.send_many_v1 (migration 0005), replaced by gov.send_many_v2 in migration 0016: as
-- gov.decide_many_v1 above, over send_many_v2.
CREATE FUNCTION gov.send_many_v1(
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
    user_id    text,
    allowed    boolean,
    action     text,
    reason     text,
    repeated   boolean,
    outbox_ids bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    RETURN QUERY
    SELECT s.user_id, s.allowed, s.action, s.reason, s.repeated, s.outbox_ids
      FROM gov.shard_groups_v1(p_user_ids) g
     CROSS JOIN LATERAL gov.send_many_v2(g.shard_key, g.user_ids, p_message_id, p_tier, p_topic, p_campaign_id,
                                         p_content, p_collapse_key, p_ttl_s, v_now) s
     ORDER BY s.user_id;
END;
$$;
