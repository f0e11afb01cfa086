-- Migration 0019, undone: subscribe without the endpoint lock.

CREATE OR REPLACE FUNCTION gov.subscribe_v2(p_user_id text, p_endpoint text, p_p256dh text, p_auth text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id  bigint;
    v_now timestamptz := clock_timestamp();  -- a variable: Citus refuses volatile calls in an UPDATE
BEGIN
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
