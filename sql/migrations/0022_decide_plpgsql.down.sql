-- Undo migration 0022: gov.decide_v1 back in SQL.

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
LANGUAGE sql AS $$
    SELECT * FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, p_now, false);
$$;
