-- gov: every table of the schema, with its indexes: policy, users, decisions, the deferral
-- queue, delivery and telemetry. Functions, triggers and views follow in the later files,
-- one concern each; this file comes first because they need the tables to exist.

-- The canonical schema is every file of sql/schema/ applied in name order. Migrations in
-- sql/migrations/ must produce exactly that
-- (tests/migration/test_migrations.py compares the catalogs).
--
-- Naming: p_ parameters, v_ locals, r_ loop records. Stable surface for users and
-- analysts: gov.decide_v1, gov.push_suppressions, the views. Everything else is internal.

CREATE SCHEMA IF NOT EXISTS gov;

-- ---------------------------------------------------------------- policy

-- One row per priority tier. P0 (exempt) is never checked nor recorded.
CREATE TABLE gov.tiers (
    tier          text    PRIMARY KEY,
    exempt        boolean NOT NULL DEFAULT false,
    on_exceed     text,
    defer_max_ms  bigint,
    default_ttl_s integer NOT NULL DEFAULT 86400,
    urgency       text    NOT NULL DEFAULT 'normal',
    CONSTRAINT tiers_name_form CHECK (tier ~ '^P[0-9]$'),
    CONSTRAINT tiers_verb_known CHECK (on_exceed IN ('drop', 'defer', 'collapse')),
    -- an exempt tier has no verb: it can never be suppressed
    CONSTRAINT tiers_exempt_has_no_verb CHECK (exempt = (on_exceed IS NULL)),
    CONSTRAINT tiers_defer_max_positive CHECK (defer_max_ms IS NULL OR defer_max_ms > 0),
    -- 2419200 s = 28 days: mirrors gov.message.MAX_TTL_S
    CONSTRAINT tiers_ttl_range CHECK (default_ttl_s BETWEEN 0 AND 2419200),
    CONSTRAINT tiers_urgency_known CHECK (urgency IN ('very-low', 'low', 'normal', 'high')),
    -- high wakes sleeping devices: transactional only (WEBPUSH.md rule 2)
    CONSTRAINT tiers_high_urgency_exempt_only CHECK (urgency <> 'high' OR exempt)
);

-- The cascade: a send in `tier` also spends the budget of `consumes`.
CREATE TABLE gov.tier_consumes (
    tier     text NOT NULL REFERENCES gov.tiers ON DELETE CASCADE,
    consumes text NOT NULL REFERENCES gov.tiers ON DELETE CASCADE,
    PRIMARY KEY (tier, consumes)
);

-- Caps, one row per rolling window. scope: a tier name, 'global', or 'topic'
-- (topic caps; `topic` = '*' applies to every topic that has no rows of its own).
CREATE TABLE gov.caps (
    scope     text    NOT NULL,
    topic     text    NOT NULL DEFAULT '',
    window_ms bigint  NOT NULL,
    cap       integer NOT NULL,
    PRIMARY KEY (scope, topic, window_ms),
    CONSTRAINT caps_scope_form CHECK (scope ~ '^P[0-9]$' OR scope IN ('global', 'topic')),
    CONSTRAINT caps_topic_only_for_topic_scope CHECK ((scope = 'topic') = (topic <> '')),
    CONSTRAINT caps_window_positive CHECK (window_ms > 0),
    CONSTRAINT caps_cap_not_negative CHECK (cap >= 0)
);

-- Policy-wide settings (one row).
CREATE TABLE gov.settings (
    id            boolean PRIMARY KEY DEFAULT true,
    quiet_start   time,
    quiet_end     time,
    jitter_ms     bigint  NOT NULL DEFAULT 0,
    -- set by gov.prune_sends_v1: send rows from before this may have been deleted
    pruned_before timestamptz,
    -- the policy's [segments] rules (gov.refresh_segments_v1): engaged = a click within
    -- segment_engaged_ms; dormant = no click for segment_dormant_ms; else casual
    segment_engaged_ms bigint NOT NULL DEFAULT 604800000,
    segment_dormant_ms bigint NOT NULL DEFAULT 2592000000,
    CONSTRAINT settings_single_row CHECK (id),
    CONSTRAINT settings_quiet_both_or_neither CHECK ((quiet_start IS NULL) = (quiet_end IS NULL)),
    CONSTRAINT settings_jitter_not_negative CHECK (jitter_ms >= 0),
    CONSTRAINT settings_segment_rules_ordered
        CHECK (segment_engaged_ms > 0 AND segment_dormant_ms >= segment_engaged_ms),
    -- the policy's [release] per_minute: at most this many releases a minute (NULL: no
    -- limit; gov.release_due_v2)
    release_per_minute integer,
    CONSTRAINT settings_release_per_minute_positive CHECK (release_per_minute IS NULL OR release_per_minute > 0),
    -- the policy's [timing] (gov.best_slot): a held message goes at the best hour of its
    -- user's estimate within its deadline (off: at the first slot, the seeds' behaviour);
    -- P1 waits at most timing_p1_max_delay_ms past its first slot; a share timing_explore
    -- of the timed messages goes at an hour drawn from the message id instead
    timing_enabled boolean NOT NULL DEFAULT false,
    timing_p1_max_delay_ms bigint NOT NULL DEFAULT 3600000,
    timing_explore double precision NOT NULL DEFAULT 0.05,
    CONSTRAINT settings_timing_p1_max_delay_not_negative CHECK (timing_p1_max_delay_ms >= 0),
    CONSTRAINT settings_timing_explore_share CHECK (timing_explore >= 0 AND timing_explore <= 1)
);

-- A tier's windows for the users of one segment (`[tiers.P2.segments.dormant]`). For a
-- user whose segment (gov.users.segment) has rows here for a tier, these rows REPLACE
-- that tier's own windows in gov.caps; every other user gets the tier's own. A table of
-- its own rather than a segment column on gov.caps: gov.caps also holds topic and global
-- caps, which have no segment, and its readers (the user-cap guard, the what-if replay,
-- analysts) keep meaning exactly what they meant; the foreign key removes a tier's
-- segment windows with the tier. The exempt P0 is never capped, for a segment neither.
CREATE TABLE gov.segment_caps (
    tier      text    NOT NULL REFERENCES gov.tiers ON DELETE CASCADE,
    segment   text    NOT NULL,
    window_ms bigint  NOT NULL,
    cap       integer NOT NULL,
    PRIMARY KEY (tier, segment, window_ms),
    CONSTRAINT segment_caps_not_p0 CHECK (tier <> 'P0'),
    CONSTRAINT segment_caps_segment_name CHECK (segment ~ '^[a-z][a-z0-9_-]{0,31}$'),
    CONSTRAINT segment_caps_window_positive CHECK (window_ms > 0),
    CONSTRAINT segment_caps_cap_not_negative CHECK (cap >= 0)
);

-- The policy compiled for the decision: written by gov.compile_policy_v1 whenever the
-- policy is applied, read by gov.decide_core with one index scan. One group of rows per
-- (tier, topic key, segment): the topic key is '' for a message without a topic, '*' for
-- a topic without caps of its own, else a topic that has them; the segment is '' for the
-- tier's own windows, else a segment the policy gives windows. Each row is one budget the
-- decision checks, in decision order (seq: the topic, the consumed tiers from the own
-- tier downward, global), with every window of that budget ascending and its cap. A
-- topic row's budget is 'topic:', completed with the message's topic. A global policy
-- table (no user_id): a reference table on Citus, like gov.caps.
CREATE TABLE gov.compiled_rules (
    tier      text      NOT NULL,
    topic     text      NOT NULL,
    segment   text      NOT NULL,
    seq       integer   NOT NULL,
    budget    text      NOT NULL,
    scope     text      NOT NULL,
    windows   bigint[]  NOT NULL,
    caps      integer[] NOT NULL,
    PRIMARY KEY (tier, topic, segment, seq),
    CONSTRAINT compiled_rules_windows_match_caps
        CHECK (cardinality(windows) >= 1 AND cardinality(windows) = cardinality(caps))
);

-- Every applied policy, as the TOML text that was applied: the audit trail.
CREATE TABLE gov.policy_versions (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source     text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- ---------------------------------------------------------------- users

CREATE TABLE gov.users (
    user_id     text        PRIMARY KEY,
    time_zone   text,
    quiet_start time,
    quiet_end   time,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- at most one segment (engaged, dormant, casual or the app's own): the fatigue
    -- measure reports per segment and a policy may cap a tier per segment
    segment     text        CONSTRAINT users_segment_name CHECK (segment ~ '^[a-z][a-z0-9_-]{0,31}$'),
    CONSTRAINT users_quiet_both_or_neither CHECK ((quiet_start IS NULL) = (quiet_end IS NULL))
);

-- A user's own caps. They may only lower the default (trigger in 10_policy.sql): a user who
-- finds two a day too many gets a dial that is not the browser's Block button.
CREATE TABLE gov.user_caps (
    user_id   text    NOT NULL,
    scope     text    NOT NULL,
    window_ms bigint  NOT NULL,
    cap       integer NOT NULL,
    PRIMARY KEY (user_id, scope, window_ms),
    CONSTRAINT user_caps_scope_form CHECK (scope ~ '^P[0-9]$' OR scope IN ('global', 'topic')),
    CONSTRAINT user_caps_cap_not_negative CHECK (cap >= 0)
);

-- Topics a user opted out of, from their preference centre (PUT /users/{id}/preferences).
-- Stored here for the decision to honour; see docs/analysts.md for its status.
CREATE TABLE gov.user_topic_optouts (
    user_id    text        NOT NULL,
    topic      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (user_id, topic),
    CONSTRAINT user_topic_optouts_topic_not_empty CHECK (topic <> '')
);

-- ---------------------------------------------------------------- decisions

-- One row per (user, message) ever decided: the idempotency key and the verdict a
-- repeat returns.
CREATE TABLE gov.messages (
    user_id        text        NOT NULL,
    message_id     text        NOT NULL,
    tier           text        NOT NULL,
    topic          text,
    campaign_id    text,
    allowed        boolean     NOT NULL,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    decided_at     timestamptz NOT NULL,
    PRIMARY KEY (user_id, message_id),
    CONSTRAINT messages_verdict_shape CHECK (allowed = (action IS NULL AND reason IS NULL))
);

-- One row per spent budget: budget is a tier name, 'global', or 'topic:<topic>'.
-- The primary key leads (user_id, budget, sent_at), so every window count is a range
-- scan on it whatever the history (PERFORMANCE.md: the index hazard).
CREATE TABLE gov.sends (
    user_id    text        NOT NULL,
    budget     text        NOT NULL,
    sent_at    timestamptz NOT NULL,
    message_id text        NOT NULL,
    PRIMARY KEY (user_id, budget, sent_at, message_id)
);

-- The seed's suppression log, plus the tier whose window blocked (reason names only
-- the window) and the count in it.
CREATE TABLE gov.push_suppressions (
    id             bigint      GENERATED ALWAYS AS IDENTITY,
    user_id        text        NOT NULL,
    message_id     text        NOT NULL,
    tier           varchar(4)  NOT NULL,
    blocked_by     text        NOT NULL,
    action         varchar(10) NOT NULL,
    campaign_id    text,
    topic          text,
    blocked_scope  text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- the user's segment when decided (NULL: none); with segment caps in the policy, the
    -- windows that blocked were that segment's
    segment        text,
    -- every key of a per-user table leads with user_id, so the table distributes by it
    -- (70_scale_out.sql)
    CONSTRAINT push_suppressions_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT push_suppressions_action_known CHECK (action IN ('drop', 'defer', 'collapse'))
);
CREATE INDEX idx_suppressions_campaign ON gov.push_suppressions (campaign_id, blocked_by);
CREATE INDEX idx_suppressions_user_time ON gov.push_suppressions (user_id, created_at DESC);

-- ---------------------------------------------------------------- the deferral queue

-- A suppressed message that still has value waits here: deferred by its tier's verb
-- (kind 'defer'), held by quiet hours ('quiet'), or held to be collapsed into one
-- summary per collapse key ('collapse'). Every outcome stays as a row for analysts.
CREATE TABLE gov.deferred (
    id            bigint      GENERATED ALWAYS AS IDENTITY,
    user_id       text        NOT NULL,
    message_id    text        NOT NULL,
    tier          text        NOT NULL,
    kind          text        NOT NULL,
    collapse_key  text,
    blocked_by    text        NOT NULL,
    enqueued_at   timestamptz NOT NULL,
    planned_at    timestamptz NOT NULL,
    release_at    timestamptz NOT NULL,
    give_up_at    timestamptz,
    state         text        NOT NULL DEFAULT 'waiting',
    outcome       text,
    collapsed_into text,
    finished_at   timestamptz,
    stands_for    integer     NOT NULL DEFAULT 1,
    error         text,
    -- how planned_at was chosen when [timing] is on: 'best' (the best hour of the user's
    -- estimate), 'explore' (an hour drawn from the message id, so the estimate can tell
    -- what it learned from its own choices); NULL: the first slot
    timing        text,
    -- with timing: the first slot, from which the row could have gone (planned_at is the
    -- later hour timing chose). From then on it contends for a slot that a row of its tier
    -- with a later deadline is about to take (the release order). NULL: planned_at is it.
    first_at      timestamptz,
    CONSTRAINT deferred_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT deferred_kind_known CHECK (kind IN ('defer', 'quiet', 'collapse')),
    CONSTRAINT deferred_state_known
        CHECK (state IN ('waiting', 'released', 'expired', 'collapsed', 'dropped', 'failed')),
    CONSTRAINT deferred_collapse_has_key CHECK (kind <> 'collapse' OR collapse_key IS NOT NULL),
    CONSTRAINT deferred_finished_when_done CHECK ((state = 'waiting') = (finished_at IS NULL)),
    CONSTRAINT deferred_one_row_per_message UNIQUE (user_id, message_id),
    -- a carrier stands for itself and every message collapsed into it
    CONSTRAINT deferred_stands_for_positive CHECK (stands_for >= 1),
    -- a failed row says why (an operator reads it; gov check alarms on it)
    CONSTRAINT deferred_failed_says_why CHECK ((state = 'failed') = (error IS NOT NULL)),
    CONSTRAINT deferred_timing_known CHECK (timing IN ('best', 'explore'))
);
-- the releaser scans only what still waits, in release order
CREATE INDEX deferred_due ON gov.deferred (release_at) WHERE state = 'waiting';
-- a user's waiting rows by the slot they wait for: the release order's contenders, and the
-- send's look for a slot owed to a nearer deadline (gov.release_owed), one probe each
CREATE INDEX deferred_waiting_user ON gov.deferred (user_id, planned_at) WHERE state = 'waiting';
-- a collapse group (user, key) has one waiting row, its carrier: the newest member
-- (older members are collapsed into it as soon as it arrives)
CREATE UNIQUE INDEX deferred_one_carrier ON gov.deferred (user_id, collapse_key)
    WHERE state = 'waiting' AND kind = 'collapse';

-- The population's and each segment's reach by local hour (segment '' = all users), as
-- gov.hour_curves_v2 estimated it when gov.refresh_timing_curves_v1 last ran: the prior
-- of the timing (gov.best_slot), read at every hold, so a hold never scans every user's
-- events. A global table (a reference table on Citus).
CREATE TABLE gov.timing_curves (
    segment      text             NOT NULL,
    hour         integer          NOT NULL,
    estimate     double precision NOT NULL,
    refreshed_at timestamptz      NOT NULL,
    CONSTRAINT timing_curves_pkey PRIMARY KEY (segment, hour),
    CONSTRAINT timing_curves_hour_of_day CHECK (hour BETWEEN 0 AND 23)
);

-- The releases of each minute, counted against [release] per_minute (gov.take_release_slot).
-- user_id is the shard's key ('' on one server; a shard key of gov.shard_keys_v1 on a
-- cluster), so the table is distributed with the users and each shard counts on its own
-- node. Only the current minute is read; older ones are cleared as minutes begin.
CREATE TABLE gov.release_minutes (
    user_id text        NOT NULL,
    minute  timestamptz NOT NULL,
    used    integer     NOT NULL,
    CONSTRAINT release_minutes_pkey PRIMARY KEY (user_id, minute),
    CONSTRAINT release_minutes_used_not_negative CHECK (used >= 0)
);

-- ---------------------------------------------------------------- delivery

-- A user's push endpoints. Budgets belong to the user, not to these rows (invariant 5):
-- subscribing again never resets anything. A retired endpoint is kept, with when and why.
CREATE TABLE gov.subscriptions (
    id             bigint      GENERATED ALWAYS AS IDENTITY,
    user_id        text        NOT NULL,
    endpoint       text        NOT NULL,
    p256dh         text        NOT NULL,
    auth           text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    retired_at     timestamptz,
    retired_reason text,
    CONSTRAINT subscriptions_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT subscriptions_retired_with_reason CHECK ((retired_at IS NULL) = (retired_reason IS NULL))
);
-- one live row per user and endpoint: a browser that resubscribes the same endpoint
-- updates it (and one that another user subscribes is retired for the earlier one:
-- gov.subscribe_v2, which finds it by the second index)
CREATE UNIQUE INDEX subscriptions_live_endpoint ON gov.subscriptions (user_id, endpoint) WHERE retired_at IS NULL;
CREATE INDEX subscriptions_endpoint ON gov.subscriptions (endpoint) WHERE retired_at IS NULL;

-- What a message says, kept for delivery now or at release later.
CREATE TABLE gov.message_content (
    user_id      text        NOT NULL,
    message_id   text        NOT NULL,
    content      jsonb       NOT NULL,
    collapse_key text,
    ttl_s        integer     NOT NULL,
    expires_at   timestamptz NOT NULL,
    -- a campaign sent at each user's best hour (gov.send_many_best_v1): how its slot was
    -- chosen, 'best' or 'explore' (NULL: at once), so an analyst can keep the explored
    -- deliveries apart when judging the estimate
    timing       text,
    PRIMARY KEY (user_id, message_id),
    -- 2419200 s = 28 days: mirrors gov.message.MAX_TTL_S
    CONSTRAINT message_content_ttl_range CHECK (ttl_s BETWEEN 0 AND 2419200),
    CONSTRAINT message_content_timing_known CHECK (timing IN ('best', 'explore'))
);

-- One row per (message, live endpoint), written in the decision's transaction.
-- Claimed with a committed lease (no transaction held across the HTTP call): a dead
-- worker's row is reclaimed when its lease runs out, so delivery is at least once.
-- claim_token is the fencing token: every claim increments it, and an outcome is
-- recorded only with the token of the claim that still holds the row (invariant 12).
CREATE TABLE gov.outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    user_id         text        NOT NULL,
    message_id      text        NOT NULL,
    subscription_id bigint      NOT NULL,
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    lease_until     timestamptz,
    leased_by       text,
    last_status     integer,
    last_error      text,
    created_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    claim_token     bigint      NOT NULL DEFAULT 0,
    CONSTRAINT outbox_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT outbox_subscription_known FOREIGN KEY (user_id, subscription_id)
        REFERENCES gov.subscriptions (user_id, id),
    CONSTRAINT outbox_state_known CHECK (state IN ('pending', 'sending', 'delivered', 'failed', 'gone', 'expired')),
    CONSTRAINT outbox_lease_while_sending CHECK ((state = 'sending') = (lease_until IS NOT NULL)),
    CONSTRAINT outbox_one_row_per_endpoint UNIQUE (user_id, message_id, subscription_id)
);
-- the runner's claim scans only rows still to do
CREATE INDEX outbox_due ON gov.outbox (next_attempt_at) WHERE state IN ('pending', 'sending');
-- a 404/410 ends the endpoint's other rows still to do at once
CREATE INDEX outbox_subscription_todo ON gov.outbox (subscription_id) WHERE state IN ('pending', 'sending');
-- the claim of given rows (gov.send's own attempt, the releaser's, a runner handed rows)
-- finds them by id: the primary key leads with user_id, so without this each such claim
-- read the key index across every user (migration 0049)
CREATE INDEX outbox_todo_by_id ON gov.outbox (id) WHERE state IN ('pending', 'sending');

-- Every attempt's outcome, for operators and analysts.
CREATE TABLE gov.delivery_attempts (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    outbox_id       bigint      NOT NULL,
    user_id         text        NOT NULL,
    message_id      text        NOT NULL,
    subscription_id bigint      NOT NULL,
    origin          text        NOT NULL,
    worker          text        NOT NULL,
    outcome         text        NOT NULL,
    status          integer,
    retry_after_ms  bigint,
    error           text,
    attempted_at    timestamptz NOT NULL,
    CONSTRAINT delivery_attempts_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT delivery_attempts_outbox_known FOREIGN KEY (user_id, outbox_id)
        REFERENCES gov.outbox (user_id, id) ON DELETE CASCADE,
    CONSTRAINT delivery_attempts_outcome_known
        CHECK (outcome IN ('accepted', 'gone', 'throttled', 'transient', 'rejected', 'unauthorized', 'expired'))
);
CREATE INDEX delivery_attempts_outbox ON gov.delivery_attempts (outbox_id);
CREATE INDEX delivery_attempts_origin_time ON gov.delivery_attempts (origin, attempted_at DESC);

-- ---------------------------------------------------------------- telemetry

-- Event-grained telemetry. 'accepted' is written by a trigger (50_analytics.sql) when the runner
-- records an accepted attempt (one per message and endpoint); display, click, close and
-- unsubscribe arrive from the service worker (POST /events, gov.events.record_event).
-- One row per (user, message, subscription, event): a beacon sent twice, or a message
-- a push service accepted twice (delivery is at least once), is recorded once.
CREATE TABLE gov.push_events (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    user_id         text        NOT NULL,
    message_id      text        NOT NULL,
    subscription_id bigint,
    event           text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT push_events_pkey PRIMARY KEY (user_id, id),
    -- an event belongs to a decided message: an unknown id is refused, never guessed at
    CONSTRAINT push_events_message_known FOREIGN KEY (user_id, message_id)
        REFERENCES gov.messages (user_id, message_id) ON DELETE CASCADE,
    CONSTRAINT push_events_subscription_known FOREIGN KEY (user_id, subscription_id)
        REFERENCES gov.subscriptions (user_id, id) ON DELETE CASCADE,
    CONSTRAINT push_events_event_known
        CHECK (event IN ('accepted', 'display', 'click', 'close', 'unsubscribe')),
    -- NULLS NOT DISTINCT: a beacon that names no subscription is recorded once too
    CONSTRAINT push_events_once UNIQUE NULLS NOT DISTINCT (user_id, message_id, subscription_id, event)
);
-- a user's history in time order (revocation suspects), and one event kind over a
-- window (the fatigue report starts from the window's accepted events)
CREATE INDEX push_events_user_time ON gov.push_events (user_id, created_at);
CREATE INDEX push_events_event_time ON gov.push_events (event, created_at);

-- ---------------------------------------------------------------- indexes for gov check (gov.health_v1)

-- gov check runs from cron against tables that grow with every send: its checks read
-- these small partial indexes, not the tables. Both stay empty while all is well, and
-- cost the decision and delivery paths nothing but a predicate test.
CREATE INDEX push_suppressions_p0 ON gov.push_suppressions (created_at) WHERE tier = 'P0';
CREATE INDEX delivery_attempts_auth_refused ON gov.delivery_attempts (attempted_at) WHERE status IN (401, 403);

-- ---------------------------------------------------------------- indexes for /metrics (gov.metrics_v1)

-- Recent-window counts for the Prometheus collector of `gov serve` (/metrics): BRIN
-- indexes on the time columns. The tables are appended in time order (the database's
-- clock stamps each row), so a block-range index finds the last day's pages while
-- costing the write path almost nothing (a btree would add a page to every decision).
-- Ranges not yet summarized (the newest pages) are always read, which is exactly the
-- recent data a window count wants.
CREATE INDEX messages_decided_brin ON gov.messages USING brin (decided_at);
CREATE INDEX push_suppressions_created_brin ON gov.push_suppressions USING brin (created_at);
CREATE INDEX delivery_attempts_attempted_brin ON gov.delivery_attempts USING brin (attempted_at);
