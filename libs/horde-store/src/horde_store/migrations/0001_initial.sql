-- Horde Chat schema, version 1: every table and column the text path and the chat spec need.
--
-- Sources: reference/ai-horde-text-path.md §1 (request fields), §3 (pop), §4 (submit), §5 (users, shared
-- keys, kudos, holds), §6 (workers), §7 (expiry); spec/chat-requests.md "Schema" (upstream
-- sql_statements/5.1.15.txt) for the chat columns, with the spec's types and defaults.
-- Numbering: 0001-0099 horde-store; admission 0100-0199, dispatch 0200-0299, submit 0300-0399,
-- janitor 0400-0499. A file whose first line is `-- no-transaction` runs outside a transaction.
-- Timestamps are timestamptz (UTC); kudos are double precision; lengths are tokens.

-- ---------------------------------------------------------------------------------------------------
-- Users (§5). api_key_hash = sha256_hex(HORDE_SECRET_KEY + key); NULL only for the anonymous user,
-- whose public key 0000000000 is matched by horde_store.users.authenticate, not by hash, so the seed
-- does not depend on the salt.
CREATE TABLE users (
    id                bigserial PRIMARY KEY,
    username          varchar(100) NOT NULL UNIQUE,
    api_key_hash      char(64) UNIQUE,
    oauth_id          varchar(255) UNIQUE,
    kudos             double precision NOT NULL DEFAULT 0,
    -- get_min_kudos: the floor clamp of the balance; 25 for an ordinary account, -50 anonymous
    min_kudos         double precision NOT NULL DEFAULT 25,
    -- the untrusted half of worker rewards held in escrow (User.record_contributions)
    evaluating_kudos  double precision NOT NULL DEFAULT 0,
    trusted           boolean NOT NULL DEFAULT false,
    patron            boolean NOT NULL DEFAULT false,
    flagged           boolean NOT NULL DEFAULT false,
    deleted           boolean NOT NULL DEFAULT false,
    moderator         boolean NOT NULL DEFAULT false,
    education         boolean NOT NULL DEFAULT false,   -- 1000 shared keys instead of 3
    service           boolean NOT NULL DEFAULT false,   -- may send proxied_account
    concurrency       integer NOT NULL DEFAULT 30,      -- Σn of waiting requests allowed (§5)
    worker_invited    integer NOT NULL DEFAULT 0,       -- TooManyWorkersTrusted allowance (§6)
    created           timestamptz NOT NULL DEFAULT now(),
    last_active       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT users_api_key_hash_required CHECK (api_key_hash IS NOT NULL OR id = 0)
);

-- The anonymous user (id 0, oauth_id 'anon'); bigserial starts at 1, so 0 never collides.
INSERT INTO users (id, username, api_key_hash, oauth_id, kudos, min_kudos, concurrency)
VALUES (0, 'Anonymous', NULL, 'anon', 0, -50, 30)
ON CONFLICT (id) DO NOTHING;

-- Shared keys (§5): the key is the row's UUID; the owner is charged. kudos -1 = unlimited;
-- max_text_tokens -1 = unlimited; expiry NULL = never.
CREATE TABLE user_shared_keys (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id          bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name             varchar(255),
    kudos            double precision NOT NULL DEFAULT 5000,
    utilized         double precision NOT NULL DEFAULT 0,
    expiry           timestamptz,
    max_text_tokens  integer NOT NULL DEFAULT -1,
    created          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_user_shared_keys_user_id ON user_shared_keys (user_id);

CREATE TABLE user_suspicions (
    user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    suspicion  varchar(64) NOT NULL,
    created    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, suspicion)
);

-- ---------------------------------------------------------------------------------------------------
-- Workers (§6) with the chat declaration (spec: Chat declaration on pop, Schema).
CREATE TABLE workers (
    id                           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id                      bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name                         varchar(100) NOT NULL UNIQUE,
    info                         varchar(1000),
    created                      timestamptz NOT NULL DEFAULT now(),
    last_check_in                timestamptz NOT NULL DEFAULT now(),
    ipaddr                       varchar(64),
    bridge_agent                 varchar(1000) NOT NULL DEFAULT 'unknown:0:unknown',
    threads                      integer NOT NULL DEFAULT 1,
    -- the text pop's limits: they bound text jobs only
    max_length                   integer NOT NULL DEFAULT 80,
    max_context_length           integer NOT NULL DEFAULT 2048,
    -- tokens/s, mean of the newest <=20 samples; NULL = not measured yet
    speed                        double precision,
    kudos                        double precision NOT NULL DEFAULT 0,
    contributions                double precision NOT NULL DEFAULT 0,   -- tokens generated
    fulfilments                  integer NOT NULL DEFAULT 0,
    aborted_jobs                 integer NOT NULL DEFAULT 0,            -- in the hourly window
    uncompleted_jobs             integer NOT NULL DEFAULT 0,
    last_aborted_job             timestamptz NOT NULL DEFAULT now(),    -- start of the hourly window
    uptime                       bigint NOT NULL DEFAULT 0,             -- seconds
    last_reward_uptime           bigint NOT NULL DEFAULT 0,
    paused                       boolean NOT NULL DEFAULT false,
    maintenance                  boolean NOT NULL DEFAULT false,
    maintenance_msg              varchar(1000),
    nsfw                         boolean NOT NULL DEFAULT false,
    extra_slow_worker            boolean NOT NULL DEFAULT false,
    allow_unsafe_ipaddr          boolean NOT NULL DEFAULT false,
    models                       text[] NOT NULL DEFAULT '{}',
    softprompts                  text[] NOT NULL DEFAULT '{}',
    -- chat declaration, rewritten at every pop
    accepts_chat_jobs            boolean NOT NULL DEFAULT false,
    accepts_prompt_jobs          boolean NOT NULL DEFAULT true,
    chat_features                text[],
    chat_max_context_length      integer,
    chat_max_length              integer,
    chat_model_id                varchar(255),
    image_transports             text[],
    chat_tools_max_temperature   double precision,
    nonconformant_replies        integer NOT NULL DEFAULT 0
);
CREATE INDEX ix_workers_last_check_in ON workers (last_check_in);
CREATE INDEX ix_workers_user_id ON workers (user_id);
CREATE INDEX ix_workers_models ON workers USING gin (models);
-- known-model and availability look-ups: online chat workers by model_id
CREATE INDEX ix_workers_chat_model_id ON workers (chat_model_id, last_check_in) WHERE accepts_chat_jobs;

-- Speed samples (§4 Speed): workers.speed is refreshed from the newest <=20.
CREATE TABLE worker_performances (
    id           bigserial PRIMARY KEY,
    worker_id    uuid NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    performance  double precision NOT NULL,   -- tokens/s
    created      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_worker_performances_worker_created ON worker_performances (worker_id, created DESC);
CREATE INDEX ix_worker_performances_created ON worker_performances (created);

-- Per-model samples, kept one hour (§4 Speed).
CREATE TABLE model_performances (
    id           bigserial PRIMARY KEY,
    model        varchar(255) NOT NULL,
    performance  double precision NOT NULL,
    created      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_model_performances_model_created ON model_performances (model, created DESC);

CREATE TABLE worker_suspicions (
    worker_id  uuid NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    suspicion  varchar(64) NOT NULL,
    created    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_id, suspicion)
);

-- ---------------------------------------------------------------------------------------------------
-- Requests (text and chat; §1, spec: Schema). A chat request has is_chat, messages and the chat_*
-- columns; prompt holds its flattened estimate and submitted_prompt the flattened submission.
CREATE TABLE waiting_prompts (
    id                        uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id                   bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    shared_key_id             uuid REFERENCES user_shared_keys (id) ON DELETE SET NULL,
    is_chat                   boolean NOT NULL DEFAULT false,
    prompt                    text NOT NULL DEFAULT '',
    submitted_prompt          text,
    messages                  jsonb,
    params                    jsonb NOT NULL DEFAULT '{}',   -- the mapped text params sent to workers
    models                    text[] NOT NULL DEFAULT '{}',  -- empty = any model
    n                         integer NOT NULL DEFAULT 1,    -- jobs still to hand out
    jobs                      integer NOT NULL DEFAULT 1,    -- jobs requested
    max_length                integer NOT NULL DEFAULT 80,
    max_context_length        integer NOT NULL DEFAULT 2048,
    workers                   uuid[] NOT NULL DEFAULT '{}',
    worker_blacklist          boolean NOT NULL DEFAULT false,
    trusted_workers           boolean NOT NULL DEFAULT false,
    validated_backends        boolean NOT NULL DEFAULT false,
    slow_workers              boolean NOT NULL DEFAULT true,
    disable_batching          boolean NOT NULL DEFAULT false,
    nsfw                      boolean NOT NULL DEFAULT false,
    active                    boolean NOT NULL DEFAULT false,
    faulted                   boolean NOT NULL DEFAULT false,
    cancelled                 boolean NOT NULL DEFAULT false,
    kudos                     double precision NOT NULL DEFAULT 0,   -- the quote at submission
    consumed_kudos            double precision NOT NULL DEFAULT 0,   -- tax plus settlements
    extra_priority            bigint NOT NULL DEFAULT 0,
    created                   timestamptz NOT NULL DEFAULT now(),
    expiry                    timestamptz NOT NULL DEFAULT now() + interval '20 minutes',
    client_agent              varchar(1000) NOT NULL DEFAULT 'unknown:0:unknown',
    ipaddr                    varchar(64),
    proxied_account           varchar(255),
    webhook                   varchar(1024),
    -- the stream hint; chat_extras carries it too (spec: Progress stream), this copy is for queries
    stream_progress           boolean NOT NULL DEFAULT false,
    has_images                boolean NOT NULL DEFAULT false,
    -- chat columns (spec: Schema)
    operation_key             uuid,
    operation_fingerprint     char(64),
    context_adjustments       jsonb,
    chat_extras               jsonb,
    chat_required_features    text[],
    chat_conformance          varchar(32) NOT NULL DEFAULT 'strict',
    chat_tools_temperature    double precision,
    chat_messages_offloaded   boolean NOT NULL DEFAULT false,
    chat_fault_reason         varchar(1000),
    chat_fault_rc             varchar(32)
);
-- The pop's queue (§3, §15): active, n>0, not faulted, in extra_priority DESC, created ASC order.
CREATE INDEX ix_waiting_prompts_queue ON waiting_prompts (extra_priority DESC, created ASC)
    WHERE active AND n > 0 AND NOT faulted;
CREATE INDEX ix_waiting_prompts_models ON waiting_prompts USING gin (models);
CREATE INDEX ix_waiting_prompts_expiry ON waiting_prompts (expiry);
CREATE INDEX ix_waiting_prompts_user_id ON waiting_prompts (user_id) WHERE NOT faulted AND n > 0;
-- ix_waiting_prompts_user_operation_key is built CONCURRENTLY in 0002.

-- Generations (§4, spec: Schema). user_id is the worker's owner.
CREATE TABLE processing_gens (
    id                           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    wp_id                        uuid NOT NULL REFERENCES waiting_prompts (id) ON DELETE CASCADE,
    worker_id                    uuid NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    user_id                      bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    model                        varchar(255) NOT NULL,
    generation                   text,                 -- NULL until submitted (the submit CAS)
    seed                         bigint,
    gen_metadata                 jsonb,
    state                        varchar(16) NOT NULL DEFAULT 'ok',   -- ok | censored | csam
    censored                     boolean NOT NULL DEFAULT false,
    faulted                      boolean NOT NULL DEFAULT false,
    cancelled                    boolean NOT NULL DEFAULT false,
    fake                         boolean NOT NULL DEFAULT false,
    kudos                        double precision NOT NULL DEFAULT 0,
    created                      timestamptz NOT NULL DEFAULT now(),
    started_at                   timestamptz NOT NULL DEFAULT now(),  -- the job lease starts here
    completed_at                 timestamptz,
    job_ttl                      integer NOT NULL DEFAULT 150,        -- lease seconds from started_at
    lease_cap                    integer,                             -- seconds from started_at
    over_capacity_at_assignment  boolean NOT NULL DEFAULT false,
    -- chat columns (spec: Schema)
    message                      jsonb,
    finish_reason                varchar(32),
    native_finish_reason         varchar(32),
    prompt_tokens                integer,
    completion_tokens            integer,
    reasoning_tokens             integer,
    charge_basis                 varchar(16),
    assigned_model               varchar(255),
    assigned_max_context_length  integer,
    assigned_max_length          integer,
    image_transport              varchar(16),
    chat_refusal_rc              varchar(32),
    settled_character_count      integer
);
CREATE INDEX ix_processing_gens_wp_id ON processing_gens (wp_id);
CREATE INDEX ix_processing_gens_worker_id ON processing_gens (worker_id);
-- the janitor's lapsed-lease pass reads only unfinished generations
CREATE INDEX ix_processing_gens_pending ON processing_gens (started_at)
    WHERE generation IS NULL AND NOT faulted;

-- Upfront kudos holds (§5, upfront:<wp>): released by deleting the row; the request's deletion
-- (completion clean-up, cancel, expiry) releases it through the cascade.
CREATE TABLE kudos_holds (
    wp_id          uuid PRIMARY KEY REFERENCES waiting_prompts (id) ON DELETE CASCADE,
    user_id        bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    shared_key_id  uuid REFERENCES user_shared_keys (id) ON DELETE SET NULL,
    amount         double precision NOT NULL,
    created        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_kudos_holds_user_id ON kudos_holds (user_id);
