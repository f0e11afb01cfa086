-- Migration 0048, down: gov.plain_users and gov.decide_together as migrations 0040 and 0044 left them.

-- The plain ones among users already locked, each with its own message id: those
-- gov.decide_together can decide at p_now, with no earlier verdict for their message and,
-- unless the tier is exempt, outside their quiet hours at p_now (gov.quiet_until, the
-- clock gov.decide_core consults: a time zone changes a decision only through it), no
-- caps of their own, no opt-out of the topic and no segment with windows of its own. An
-- empty or NULL id is never plain (gov.decide_core refuses it). The tier must exist.
-- Users come back in the order given.
CREATE OR REPLACE FUNCTION gov.plain_users(p_users text[], p_message_ids text[], p_tier text, p_topic text,
                                p_now timestamptz) RETURNS text[]
LANGUAGE plpgsql
-- (generic plans, as gov.decide_core: planning the probe for a batch of one cost more than running it)
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_exempt boolean;
    v_topic  text := '';
BEGIN
    SELECT t.exempt INTO STRICT v_exempt FROM gov.tiers t WHERE t.tier = p_tier;
    IF p_topic IS NOT NULL THEN
        v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                        THEN p_topic ELSE '*' END;
    END IF;
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
                                   AND ((u.time_zone IS NOT NULL AND gov.quiet_until(u.user_id, p_now) > p_now)
                                        OR EXISTS (SELECT 1 FROM gov.compiled_rules r
                                                    WHERE r.tier = p_tier AND r.topic = v_topic
                                                      AND r.segment = u.segment)))
                AND NOT EXISTS (SELECT 1 FROM gov.user_caps uc WHERE uc.user_id = x.u)
                AND NOT (p_topic IS NOT NULL
                         AND EXISTS (SELECT 1 FROM gov.user_topic_optouts o
                                      WHERE o.user_id = x.u AND o.topic = p_topic))))
         ORDER BY x.n);
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
