-- Migration 0019: two users subscribing one endpoint at the same moment leave it to one
-- of them. gov.subscribe_v2 retires other users' live row of the endpoint and inserts
-- its own; run at once, each missed the other's uncommitted row and both kept the
-- endpoint. It now takes a transaction lock on the endpoint first.

CREATE OR REPLACE FUNCTION gov.subscribe_v2(p_user_id text, p_endpoint text, p_p256dh text, p_auth text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id  bigint;
    v_now timestamptz;
BEGIN
    -- seed 1: the users' decision locks hash with seed 0
    PERFORM pg_advisory_xact_lock(hashtextextended(p_endpoint, 1));
    v_now := clock_timestamp();  -- a variable: Citus refuses volatile calls in an UPDATE
    UPDATE gov.subscriptions s
       SET retired_at = v_now, retired_reason = 'subscribed by another user'
     WHERE s.endpoint = p_endpoint AND s.user_id <> p_user_id AND s.retired_at IS NULL;
    INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth)
    VALUES (p_user_id, p_endpoint, p_p256dh, p_auth)
    ON CONFLICT (user_id, endpoint) WHERE retired_at IS NULL
    DO UPDATE SET p256dh = excluded.p256dh, auth = excluded.auth
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$$;
