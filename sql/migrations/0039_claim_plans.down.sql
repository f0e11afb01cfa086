-- Migration 0039 undone: gov.claim_local runs the one statement of migration 0036 again.
DO $do$
BEGIN
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
        LANGUAGE plpgsql AS %L$f$,
        E'#variable_conflict use_column\nBEGIN\n    RETURN QUERY ' || format(gov.claim_statement(),
            'gov.outbox', 'gov.subscriptions', 'gov.messages', 'gov.message_content', 'gov.tiers') || E';\nEND;\n');
END;
$do$;
