-- no-transaction
-- Dispatch's pop (services/dispatch/src/horde_dispatch/queue.py) narrows the queue with
-- `models && <the pop's models> OR cardinality(models) = 0`. The first arm reads ix_waiting_prompts_models
-- (GIN); this partial index serves the second arm (text requests for any model), so the planner can
-- BitmapOr both when the worker's models are rare in the queue, instead of walking the whole queue index
-- (an empty pop at 10,000 queued requests for other models took a 30 ms sequential scan).
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_waiting_prompts_queue_any_model
    ON waiting_prompts (extra_priority DESC, created ASC)
    WHERE active AND n > 0 AND NOT faulted AND cardinality(models) = 0;
