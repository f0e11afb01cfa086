-- Undo migration 0020: every user of a campaign batch through gov.decide_core or gov.send_v1, in user order.

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
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    r_user record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    FOR r_user IN SELECT DISTINCT u AS id FROM unnest(p_user_ids) u ORDER BY 1 LOOP
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
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    r_user record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    FOR r_user IN SELECT DISTINCT u AS id FROM unnest(p_user_ids) u ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, s.allowed, s.action, s.reason, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, p_content,
                           p_collapse_key, p_ttl_s, v_now) s;
    END LOOP;
END;
$$;

DROP FUNCTION gov.decide_together(text[], text, text, text, text, timestamptz);
DROP FUNCTION gov.lock_batch(text[], text, text, text);
