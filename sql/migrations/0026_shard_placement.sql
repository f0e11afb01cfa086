-- Migration 0026: gov.shard_relation reads a shard only where Citus's metadata places it,
-- and holds the shard's metadata against a move (issue 28, item 6): a table of the
-- shard's name alone was enough, and a moved shard's old table stays behind on its old
-- node until Citus drops it. Volatile now (it takes a lock).

CREATE OR REPLACE FUNCTION gov.shard_relation(p_table regclass, p_shard_key text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_shard   text;
    v_shardid bigint;
BEGIN
    IF NOT gov.distributed() THEN
        RETURN p_table::text;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = p_table AND p.partmethod = 'n') THEN
        -- a reference table: every node has its one shard
        SELECT s.shardid INTO v_shardid FROM pg_dist_shard s WHERE s.logicalrelid = p_table;
    ELSE
        IF p_shard_key IS NULL THEN
            RAISE EXCEPTION 'on a Citus cluster % is read one shard at a time: give a shard key (gov.shard_keys_v1())',
                p_table USING ERRCODE = '22023';
        END IF;
        v_shardid := get_shard_id_for_distribution_column(p_table, p_shard_key);
    END IF;
    v_shard := shard_name(p_table, v_shardid);
    -- Citus's own lock against a move: a shard move switches placements under an exclusive
    -- lock on the shard's metadata (BlockWritesToShardList), so this share lock, held to
    -- the end of the transaction, keeps the placement read here the active one. Citus
    -- grants it to the tables' owner only: a role that is not (docs/scale-out.md) has the
    -- placement check below and no lock.
    BEGIN
        PERFORM lock_shard_metadata(5, ARRAY[v_shardid]);  -- 5: ShareLock
    EXCEPTION WHEN insufficient_privilege THEN
        NULL;
    END;
    -- The placement must be this node's in Citus's metadata: a table of the shard's name
    -- alone is not enough, since a moved shard's old table stays behind until Citus drops it.
    IF to_regclass(v_shard) IS NULL
       OR NOT EXISTS (SELECT 1 FROM pg_dist_placement pl
                       WHERE pl.shardid = v_shardid AND pl.groupid = (SELECT g.groupid FROM pg_dist_local_group g)) THEN
        RAISE EXCEPTION 'shard % of % is not on this node: call the function through the coordinator, '
                        'which delegates it to the worker that holds the shard', v_shard, p_table
            USING ERRCODE = '55000';
    END IF;
    RETURN v_shard;
END;
$$;
