-- Migration 0049: the outbox rows still to do, indexed by id. The claim of given rows
-- (gov.claim_outbox_v3 with p_ids: gov.send's own attempt, the releaser's, a runner handed
-- rows) names rows by id alone, and the primary key is (user_id, id): with no index on id,
-- its generic plan read the key index across every user (a skip scan on PostgreSQL 18: 215
-- index pages for a claim of ten rows among 2,000 users) or, on PostgreSQL 15, every row
-- still to do through outbox_due (all of a backlog). Partial
-- like outbox_due: a row leaves it when it is finished, so it holds only the rows to do.
-- (docs/performance.md, stop 47.) As in sql/schema/ at this revision.
-- On a Citus cluster, over one connection per node: an upgrade (or a downgrade) runs its
-- migrations in one transaction, and an index made over parallel connections would make
-- Citus refuse every function command after it in that transaction. (A statement of its
-- own, EXECUTE: Citus sends the command's text to the workers, which must be one command.)
DO $$
BEGIN
    IF gov.on_citus() THEN
        SET LOCAL citus.multi_shard_modify_mode = 'sequential';
    END IF;
    EXECUTE $ddl$CREATE INDEX outbox_todo_by_id ON gov.outbox (id) WHERE state IN ('pending', 'sending')$ddl$;
END;
$$;
