-- Migration 0039 (issue 31, the first run): on one server gov.claim_local runs one of two
-- statements, the claim of given rows (gov.send's own attempt, a runner handed rows) or
-- of any due rows, each with a generic plan, made once per session and again after an
-- ANALYZE of its tables (the plan cache's invalidation). With the one statement's
-- `($2 IS NULL OR o.id = ANY ($2))` the plan cache kept choosing a plan for the call's own
-- values: the default `gov simulate` planned the claim on 3,156 of its 3,786 calls, 2.5 ms
-- a plan against 0.8 ms to run it (pg_stat_statements with track_planning,
-- docs/performance.md, stop 41). Both are made from gov.claim_statement(), as before, so
-- the forms cannot drift apart; a Citus cluster EXECUTEs that text as before. Signatures
-- unchanged. As in sql/schema/ at this revision.
DO $do$
DECLARE
    v_any   text := format(gov.claim_statement(),
                           'gov.outbox', 'gov.subscriptions', 'gov.messages', 'gov.message_content', 'gov.tiers');
    v_given text;
BEGIN
    v_given := replace(v_any, '($2 IS NULL OR o.id = ANY ($2))', 'o.id = ANY ($2)');
    v_any := replace(v_any, '($2 IS NULL OR o.id = ANY ($2))', 'true');
    IF v_given = v_any OR strpos(v_given, 'o.id = ANY ($2)') = 0 THEN
        RAISE EXCEPTION 'gov.claim_statement() no longer has the rows filter this migration splits on';
    END IF;
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION gov.claim_local(timestamptz, bigint[], integer, text, bigint)
        RETURNS TABLE (
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
        LANGUAGE plpgsql
        SET plan_cache_mode = force_generic_plan
        AS %L$f$,
        E'#variable_conflict use_column\nBEGIN\n    IF $2 IS NULL THEN\n        RETURN QUERY ' || v_any
        || E';\n    ELSE\n        RETURN QUERY ' || v_given || E';\n    END IF;\nEND;\n');
END;
$do$;
