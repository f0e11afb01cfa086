-- Migration 0022: gov.decide_v1 in PL/pgSQL (sql/schema/20_decide.sql). Before PostgreSQL
-- 18 a SQL-language function's statement is planned again on every call; on PostgreSQL
-- 15 that was 15-20 % of a decision. Same signature, same rows.

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
