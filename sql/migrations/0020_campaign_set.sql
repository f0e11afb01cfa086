-- Migration 0020: a campaign batch decides its plain users together (sql/schema/20_decide.sql).
-- gov.lock_batch locks a batch's users in user order and picks the plain ones (no earlier
-- verdict for the message, no time zone, no caps of their own, no opt-out of the topic,
-- no segment with windows of its own); gov.decide_together decides them in one
-- statement, with the verdicts and rows gov.decide_core gives them one by one.
-- gov.decide_many_v2 uses both; gov.send_many_v2 too, for a tier that holds nothing
-- (exempt, or one that drops), storing the content and fanning out in a few statements.
-- Everyone else, and every user on a Citus cluster, still goes through gov.decide_core
-- and gov.send_v1. Signatures unchanged; rows no longer come in user order
-- (gov.Governor puts them back in it).

CREATE FUNCTION gov.lock_batch(p_users text[], p_message_id text, p_tier text, p_topic text) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_exempt boolean;
    v_topic  text := '';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(x.u, 0))
       FROM unnest(p_users) WITH ORDINALITY AS x(u, n)
      WHERE x.u <> ''
      ORDER BY x.n;
    SELECT t.exempt INTO STRICT v_exempt FROM gov.tiers t WHERE t.tier = p_tier;
    IF p_topic IS NOT NULL THEN
        v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                        THEN p_topic ELSE '*' END;
    END IF;
    -- (The earlier verdict is probed per user, by its key: every row of the campaign's
    -- earlier batches has this message id, so a join on it would read them all.)
    RETURN ARRAY(
        SELECT x.u FROM unnest(p_users) WITH ORDINALITY AS x(u, n)
          LEFT JOIN LATERAL (SELECT true AS seen FROM gov.messages m
                              WHERE m.user_id = x.u AND m.message_id = p_message_id LIMIT 1) e ON true
         WHERE x.u <> '' AND e.seen IS NULL
           AND (v_exempt OR (
                    NOT EXISTS (SELECT 1 FROM gov.users u
                                 WHERE u.user_id = x.u
                                   AND (u.time_zone IS NOT NULL
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
        SELECT p.u, b.u IS NULL AS ok, b.scope,
               CASE WHEN b.u IS NOT NULL THEN v_tier.on_exceed END AS act,
               CASE b.scope WHEN 'topic' THEN 'topic_cap_' WHEN 'global' THEN 'global_cap_' ELSE 'cap_' END
                   || b.w || 'ms' AS rule,
               b.n::integer AS n, b.c AS c,
               -- a slot frees when enough of the oldest rows leave the window (a cap of 0: never)
               CASE WHEN f.free_at IS NOT NULL
                    THEN greatest(0, ceil(extract(epoch FROM f.free_at - p_now) * 1000))::bigint END AS retry
          FROM unnest(p_users) p(u)
          LEFT JOIN blocked b ON b.u = p.u
          LEFT JOIN LATERAL (
                 SELECT (array_agg(s.sent_at ORDER BY s.sent_at))[b.n - b.c + 1]
                        + b.w * interval '1 millisecond' AS free_at
                   FROM gov.sends s
                  WHERE b.c > 0 AND s.user_id = b.u AND s.budget = b.budget
                    AND s.sent_at > p_now - b.w * interval '1 millisecond') f ON b.u IS NOT NULL
    ), spent AS (
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v.u, sb.b, p_now, p_message_id FROM verdict v CROSS JOIN unnest(v_spend) sb(b) WHERE v.ok
    ), decided AS (
        INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                  reason, used, cap, retry_after_ms, decided_at)
        SELECT v.u, p_message_id, p_tier, p_topic, p_campaign_id, v.ok, v.act, v.rule, v.n, v.c, v.retry, p_now
          FROM verdict v
    ), logged AS (
        INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                           campaign_id, topic, blocked_scope, used, cap,
                                           retry_after_ms, created_at, segment)
        SELECT v.u, p_message_id, p_tier, v.rule, v.act, p_campaign_id, p_topic, v.scope, v.n, v.c,
               v.retry, p_now, (SELECT u.segment FROM gov.users u WHERE u.user_id = v.u)
          FROM verdict v
         WHERE NOT v.ok
         ORDER BY v.u
    )
    SELECT v.u, v.ok, v.act, v.rule, v.n, v.c, v.retry FROM verdict v;
END;
$$;

CREATE OR REPLACE FUNCTION gov.decide_many_v2(
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
        v_plain := gov.lock_batch(v_users, p_message_id, p_tier, p_topic);
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
    -- Bad input (an unknown tier, no message id, a TTL under a second, an empty user id)
    -- is send_v1's to refuse.
    IF FOUND AND p_message_id <> '' AND (p_ttl_s IS NULL OR p_ttl_s >= 1) AND NOT gov.distributed() THEN
        v_plain := gov.lock_batch(v_users, p_message_id, p_tier, p_topic);
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
