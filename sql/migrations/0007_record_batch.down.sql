DROP FUNCTION gov.record_attempts_v1(text, jsonb, integer, bigint, bigint, timestamptz);
