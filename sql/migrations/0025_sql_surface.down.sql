-- Undo migration 0025: the wrappers of the released names go again (as migrations 0010
-- and 0016 left them: dropped).

DROP FUNCTION gov.decide_many_v1(text[], text, text, text, text, timestamptz);
DROP FUNCTION gov.send_many_v1(text[], text, text, text, text, jsonb, text, integer, timestamptz);
DROP FUNCTION gov.release_due_v1(integer, timestamptz);
DROP FUNCTION gov.subscribe_v1(text, text, text, text);
DROP FUNCTION gov.claim_outbox_v1(text, integer, bigint, timestamptz, bigint[]);
DROP FUNCTION gov.claim_outbox_v2(text, integer, bigint, timestamptz, bigint[]);
DROP FUNCTION gov.record_attempts_v1(text, jsonb, integer, bigint, bigint, timestamptz);
DROP FUNCTION gov.record_attempts_v2(text, jsonb, integer, bigint, bigint, timestamptz);
DROP FUNCTION gov.record_attempt_v1(bigint, text, text, text, integer, bigint, text, integer, bigint, bigint, timestamptz);
DROP FUNCTION gov.record_attempt_v2(bigint, bigint, text, text, text, integer, bigint, text, integer, bigint, bigint, timestamptz);
