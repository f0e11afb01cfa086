-- Migration 0012: a user belongs to at most one segment (engaged, dormant, casual, or the
-- app's own name). Set by the app in SQL or through the API, or by `gov segments refresh`.
-- The fatigue measure reports per segment; a policy may cap a tier per segment.

ALTER TABLE gov.users
    ADD COLUMN segment text
        CONSTRAINT users_segment_name CHECK (segment ~ '^[a-z][a-z0-9_-]{0,31}$');
