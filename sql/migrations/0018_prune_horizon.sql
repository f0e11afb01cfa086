-- Migration 0018: gov.prune_sends_v1 keeps every send row a cap can still read. Its
-- horizon was the longest window of gov.caps only, so a segment's window longer than
-- its tier's (or a user's own) lost its rows to `gov prune`, and the user could then be
-- sent past that cap.

CREATE OR REPLACE FUNCTION gov.prune_sends_v1(p_batch integer, p_margin interval, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_longest bigint;
    v_count   integer;
BEGIN
    -- the longest window any cap reads: the tiers', topics' and global ones, a segment's
    -- own windows (which may be longer than its tier's), and users' own caps
    SELECT greatest((SELECT coalesce(max(c.window_ms), 0) FROM gov.caps c),
                    (SELECT coalesce(max(sc.window_ms), 0) FROM gov.segment_caps sc),
                    (SELECT coalesce(max(uc.window_ms), 0) FROM gov.user_caps uc))
      INTO v_longest;
    -- by primary key, not ctid: on a Citus cluster the rows are in many shards
    DELETE FROM gov.sends s
     WHERE (s.user_id, s.budget, s.sent_at, s.message_id) IN (
            SELECT x.user_id, x.budget, x.sent_at, x.message_id FROM gov.sends x
             WHERE x.sent_at < v_now - v_longest * interval '1 millisecond' - p_margin
             LIMIT p_batch);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        -- what is older than this may have lost its send rows: the conservation check
        -- must not read a pruned message as "allowed without spending its budget"
        UPDATE gov.settings s
           SET pruned_before = greatest(s.pruned_before, v_now - v_longest * interval '1 millisecond' - p_margin);
    END IF;
    RETURN v_count;
END;
$$;
