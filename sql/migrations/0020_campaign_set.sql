-- Migration 0020: a campaign batch decides its plain users together (sql/schema/20_decide.sql):
-- users with no earlier verdict for the message, no time zone, no caps of their own, no
-- opt-out of the topic and no segment with windows of its own are decided in one
-- statement, with the verdicts and suppression rows gov.decide_core gives them one by one;
-- everyone else, and every user on a Citus cluster, still goes through gov.decide_core.
-- Signature unchanged; rows no longer come in user order (gov.Governor never relied on it).

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
    v_tier  gov.tiers%ROWTYPE;
    v_topic text := '';
    v_users text[];
    v_plain text[] := '{}';
    v_spend text[];
    r_user  record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    v_users := ARRAY(SELECT DISTINCT u FROM unnest(p_user_ids) u ORDER BY 1);
    SELECT * INTO v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    -- Bad input (an unknown tier, no message id, an empty user id) is decide_core's to refuse.
    IF FOUND AND p_message_id <> '' AND NOT gov.distributed() THEN
        -- Every user's lock, in user order, before anything is read.
        PERFORM pg_advisory_xact_lock(hashtextextended(x.u, 0))
           FROM unnest(v_users) WITH ORDINALITY AS x(u, n)
          WHERE x.u <> ''
          ORDER BY x.n;
        IF p_topic IS NOT NULL THEN
            v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                            THEN p_topic ELSE '*' END;
        END IF;
        -- (The earlier verdict is probed per user, by its key: every row of the campaign's
        -- earlier batches has this message id, so a join on it would read them all.)
        v_plain := ARRAY(
            SELECT x.u FROM unnest(v_users) x(u)
              LEFT JOIN LATERAL (SELECT true AS seen FROM gov.messages m
                                  WHERE m.user_id = x.u AND m.message_id = p_message_id LIMIT 1) e ON true
             WHERE x.u <> '' AND e.seen IS NULL
               AND (v_tier.exempt OR (
                        NOT EXISTS (SELECT 1 FROM gov.users u
                                     WHERE u.user_id = x.u
                                       AND (u.time_zone IS NOT NULL
                                            OR EXISTS (SELECT 1 FROM gov.compiled_rules r
                                                        WHERE r.tier = p_tier AND r.topic = v_topic
                                                          AND r.segment = u.segment)))
                    AND NOT EXISTS (SELECT 1 FROM gov.user_caps uc WHERE uc.user_id = x.u)
                    AND NOT (p_topic IS NOT NULL
                             AND EXISTS (SELECT 1 FROM gov.user_topic_optouts o
                                          WHERE o.user_id = x.u AND o.topic = p_topic)))));
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
            -- every window of every rule, per user: one range scan per budget over its longest
            SELECT p.u, r.seq, r.scope, r.budget, x.i, x.w, x.c,
                   CASE WHEN x.i <= 4 THEN k.counts[x.i]
                        ELSE (SELECT count(*) FROM gov.sends s
                               WHERE s.user_id = p.u AND s.budget = r.budget
                                 AND s.sent_at > v_now - x.w * interval '1 millisecond') END AS n
              FROM unnest(v_plain) p(u)
             CROSS JOIN rules r
             CROSS JOIN LATERAL (
                    SELECT ARRAY[count(*) FILTER (WHERE s.sent_at > v_now - r.windows[1] * interval '1 millisecond'),
                                 count(*) FILTER (WHERE s.sent_at > v_now - r.windows[2] * interval '1 millisecond'),
                                 count(*) FILTER (WHERE s.sent_at > v_now - r.windows[3] * interval '1 millisecond'),
                                 count(*) FILTER (WHERE s.sent_at > v_now - r.windows[4] * interval '1 millisecond')]
                           AS counts
                      FROM gov.sends s
                     WHERE s.user_id = p.u AND s.budget = r.budget
                       AND s.sent_at > v_now - r.windows[least(cardinality(r.windows), 4)]
                                               * interval '1 millisecond') k
             CROSS JOIN LATERAL unnest(r.windows, r.caps) WITH ORDINALITY AS x(w, c, i)
        ), blocked AS (
            -- the first window that blocks, in decision order
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
                        THEN greatest(0, ceil(extract(epoch FROM f.free_at - v_now) * 1000))::bigint END AS retry
              FROM unnest(v_plain) p(u)
              LEFT JOIN blocked b ON b.u = p.u
              LEFT JOIN LATERAL (
                     SELECT (array_agg(s.sent_at ORDER BY s.sent_at))[b.n - b.c + 1]
                            + b.w * interval '1 millisecond' AS free_at
                       FROM gov.sends s
                      WHERE b.c > 0 AND s.user_id = b.u AND s.budget = b.budget
                        AND s.sent_at > v_now - b.w * interval '1 millisecond') f ON b.u IS NOT NULL
        ), spent AS (
            INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
            SELECT v.u, sb.b, v_now, p_message_id FROM verdict v CROSS JOIN unnest(v_spend) sb(b) WHERE v.ok
        ), decided AS (
            INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                      reason, used, cap, retry_after_ms, decided_at)
            SELECT v.u, p_message_id, p_tier, p_topic, p_campaign_id, v.ok, v.act, v.rule, v.n, v.c, v.retry, v_now
              FROM verdict v
        ), logged AS (
            INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                               campaign_id, topic, blocked_scope, used, cap,
                                               retry_after_ms, created_at, segment)
            SELECT v.u, p_message_id, p_tier, v.rule, v.act, p_campaign_id, p_topic, v.scope, v.n, v.c,
                   v.retry, v_now, (SELECT u.segment FROM gov.users u WHERE u.user_id = v.u)
              FROM verdict v
             WHERE NOT v.ok
             ORDER BY v.u
        )
        SELECT v.u, v.ok, v.act, v.rule, v.n, v.c, v.retry, false FROM verdict v;
    END IF;
    FOR r_user IN SELECT u AS id FROM unnest(v_users) u WHERE NOT u = ANY (v_plain) OR u IS NULL ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, d.repeated
          FROM gov.decide_core(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;
    END LOOP;
END;
$$;
