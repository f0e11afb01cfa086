-- Migration 0049: the outbox rows still to do, indexed by id. The claim of given rows
-- (gov.claim_outbox_v3 with p_ids: gov.send's own attempt, the releaser's, a runner handed
-- rows) names rows by id alone, and the primary key is (user_id, id): with no index on id,
-- its generic plan read the key index across every user (a skip scan on PostgreSQL 18, the
-- whole index before it), 215 index pages for a claim of ten rows among 2,000 users. Partial
-- like outbox_due: a row leaves it when it is finished, so it holds only the rows to do.
-- (docs/performance.md, stop 47.) As in sql/schema/ at this revision.
CREATE INDEX outbox_todo_by_id ON gov.outbox (id) WHERE state IN ('pending', 'sending');
