-- gov: the policy's guards and changes (its tables, tiers to policy_versions, are in
-- 00_tables.sql). A user's own caps may only lower a default; a policy that removes tiers
-- reports, or ends, what those tiers still hold (gov.retire_tiers_v1, `gov policy apply`).

-- ---------------------------------------------------------------- a user's own caps

-- The highest default a user's own cap for (scope, window) can lower: the policy's cap
-- for that window (a tier's own, or the "*" topic cap), or, for a tier, the highest of
-- its segments' caps over that window; NULL when the policy has no such window. A user
-- cap is always applied as the least of it and the default in force, so it never raises
-- anything; this is what it is checked against when it is written.
CREATE FUNCTION gov.user_cap_ceiling(p_scope text, p_window_ms bigint) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_cap integer;
BEGIN
    -- The policy tables by their local relation (gov.shard_relation; themselves on one
    -- server): on a Citus cluster this runs inside a shard's statement (the user-cap
    -- trigger, the decision's rule query), where reading the reference tables by name
    -- would be a distributed query started from a shard, which Citus refuses.
    EXECUTE format($q$
        SELECT max(d.cap)
          FROM (SELECT c.cap FROM %s c
                 WHERE c.scope = $1 AND c.window_ms = $2
                   AND c.topic = CASE WHEN $1 = 'topic' THEN '*' ELSE '' END
                UNION ALL
                SELECT sc.cap FROM %s sc
                 WHERE sc.tier = $1 AND sc.window_ms = $2) d
        $q$, gov.shard_relation('gov.caps', NULL), gov.shard_relation('gov.segment_caps', NULL))
      INTO v_cap USING p_scope, p_window_ms;
    RETURN v_cap;
END;
$$;

-- Refuse a user cap that would raise a default (invariant 6), naming the offender.
CREATE FUNCTION gov.user_caps_only_lower() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_default integer;
BEGIN
    v_default := gov.user_cap_ceiling(NEW.scope, NEW.window_ms);
    IF v_default IS NULL THEN
        RAISE EXCEPTION 'user % : no default % cap over a % ms window to lower',
            NEW.user_id, NEW.scope, NEW.window_ms
            USING ERRCODE = 'GV002';
    END IF;
    IF NEW.cap > v_default THEN
        RAISE EXCEPTION 'user % : cap % for % over % ms is above the default %; a user''s own caps may only lower it',
            NEW.user_id, NEW.cap, NEW.scope, NEW.window_ms, v_default
            USING ERRCODE = 'GV002';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER user_caps_only_lower
    BEFORE INSERT OR UPDATE ON gov.user_caps
    FOR EACH ROW EXECUTE FUNCTION gov.user_caps_only_lower();

-- ---------------------------------------------------------------- the compiled policy

-- Compile the stored policy into gov.compiled_rules (`gov policy apply` runs it in its
-- transaction, after the policy tables are written). The same rules the decision used to
-- assemble on every call: topic caps (the topic's own, else "*"), then each consumed
-- tier from the message's own tier downward (the user's segment's windows for that tier
-- when the policy has them, else the tier's own), then global.
-- Without JIT: the policy tables are a few rows the planner has no statistics for (it
-- takes gov.tiers for 295 rows), so it costs the statement's cross joins in the hundreds
-- of millions, and a server built with LLVM (Debian's and most packages) spent about 0.8 s
-- compiling a statement that runs in a millisecond, at every `gov policy apply`
-- (docs/performance.md, stop 50; migration 0051).
CREATE FUNCTION gov.compile_policy_v1() RETURNS bigint
LANGUAGE sql
SET jit = off
AS $$
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

-- The budgets the compiled policy has allowed messages spend, as one value: per tier and
-- topic key (tier, US, topic: '' without a topic, the topic when it has caps of its own,
-- else '*') the budgets some cap reads, 'topic:' standing for the message's own topic;
-- and the topics with caps of their own. Read once, then looked up per message by
-- gov.budgets_of, which reads no table: a query over many users (on a Citus cluster, on
-- the shards) then never calls back into the policy tables.
CREATE FUNCTION gov.budget_map_v1() RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
               'rules', coalesce((SELECT jsonb_object_agg(k.key, k.budgets)
                                    FROM (SELECT r.tier || E'\x1f' || r.topic AS key,
                                                 jsonb_agg(DISTINCT CASE WHEN r.scope = 'topic' THEN 'topic:'
                                                                         ELSE r.budget END) AS budgets
                                            FROM gov.compiled_rules r
                                           GROUP BY r.tier, r.topic) k), '{}'),
               'topics', coalesce((SELECT jsonb_agg(DISTINCT c.topic) FROM gov.caps c WHERE c.scope = 'topic'), '[]'))
$$;

-- The budgets an allowed message of p_tier with p_topic spends, from gov.budget_map_v1().
CREATE FUNCTION gov.budgets_of(p_map jsonb, p_tier text, p_topic text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(CASE WHEN b = 'topic:' THEN 'topic:' || p_topic ELSE b END ORDER BY b), '{}')
      FROM jsonb_array_elements_text(
               p_map -> 'rules' -> (p_tier || E'\x1f' || CASE WHEN p_topic IS NULL THEN ''
                                                             WHEN p_map -> 'topics' ? p_topic THEN p_topic
                                                             ELSE '*' END)) b
$$;

-- The budgets an allowed message of p_tier with p_topic spends under the compiled
-- policy: those some cap reads, for a user of any segment. A budget no cap reads is not
-- written; a policy that caps it later fills it from gov.messages (gov.backfill_sends_v1).
CREATE FUNCTION gov.spent_budgets(p_tier text, p_topic text) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT gov.budgets_of(gov.budget_map_v1(), p_tier, p_topic)
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

-- After a policy change, give every allowed message decided within the longest window
-- before p_now the rows it would have spent and has not, from gov.messages: a budget the
-- policy caps that was not written before then counts the sends gov remembers instead of
-- starting from nothing, and a budget whose window grew counts again what `gov prune`
-- deleted under the shorter one (an outside probe: a 30-day cap of 3 allowed a 4th send
-- after a prune). A message that has its row in a budget keeps that one. p_before
-- (gov.capped_budgets() under the previous policy) once limited this to new budgets; the
-- signature keeps it, unread.
-- Returns the rows written.
CREATE FUNCTION gov.backfill_sends_v1(p_before text[], p_now timestamptz DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_map     jsonb := gov.budget_map_v1();
    v_longest bigint;
    v_count   bigint;
BEGIN
    SELECT max(w) INTO v_longest FROM gov.compiled_rules r, unnest(r.windows) w;
    IF v_longest IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
    SELECT m.user_id, b.budget, m.decided_at, m.message_id
      FROM gov.messages m
     CROSS JOIN LATERAL unnest(gov.budgets_of(v_map, m.tier, m.topic)) AS b(budget)
     WHERE m.allowed AND m.decided_at > v_now - v_longest * interval '1 millisecond' AND m.decided_at <= v_now
    ON CONFLICT DO NOTHING;  -- a row is at the decision, or at the release, which moved decided_at there
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- ---------------------------------------------------------------- policy changes

-- Messages of tiers a new policy removes: per tier, how many are held (waiting in
-- gov.deferred) and how many are queued for delivery (outbox rows not yet finished).
-- With p_drop, they are ended now, logged like any suppression (blocked_by
-- 'tier_removed', action 'drop'): a held message ends dropped, a queued outbox row
-- ends failed with that reason, never sent. Runs inside `gov policy apply`'s
-- transaction, after the policy lock.
CREATE FUNCTION gov.retire_tiers_v1(p_tiers text[], p_drop boolean, p_now timestamptz DEFAULT NULL)
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

-- ---------------------------------------------------------------- segments

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
CREATE FUNCTION gov.refresh_segments_v1(p_now timestamptz DEFAULT NULL)
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
