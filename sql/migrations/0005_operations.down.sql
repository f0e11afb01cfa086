-- Undo 0005.
DROP FUNCTION gov.message_states_v1(timestamptz, timestamptz);
DROP FUNCTION gov.prune_history_v1(integer, interval, timestamptz);
DROP FUNCTION gov.prune_sends_v1(integer, interval, timestamptz);
DROP FUNCTION gov.send_many_v1(text[], text, text, text, text, jsonb, text, integer, timestamptz);
DROP FUNCTION gov.decide_many_v1(text[], text, text, text, text, timestamptz);
