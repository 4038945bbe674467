"""The front's call records on Redis: the scripts that claim, end, count and abandon one record.

A record is the hash ``horde:oai:operation:<call key>`` (:func:`horde_core.redis_keys.operation_record_key`) on
the front's stream database, with the fields ``op`` (the operation key every attempt of the call submits with),
``state`` (``open``, ``retryable``, ``delivered`` or ``final``), ``live`` (the connections waiting on it now),
``body`` (the request digest) and ``error`` (a ``final`` idem call's settled error, JSON). Which attempt takes
over a record, and what each state means, is :mod:`horde_oai.operations`' rule; these scripts apply it in one
round trip each, so concurrent attempts on any front replica see one order.
"""

from __future__ import annotations

# KEYS[1]: the record; ARGV: new operation key, kind, declared retry (1/0), ttl, body digest.
# Returns {'new', op}, {'joined', op}, {'final', error json} or {'conflict', ''} (another body under a settled
# idem call).
CLAIM_SCRIPT = """
local state = redis.call('HGET', KEYS[1], 'state')
if state then
  if state == 'final' then
    if ARGV[2] == 'idem' then
      if redis.call('HGET', KEYS[1], 'body') ~= ARGV[5] then return {'conflict', ''} end
      return {'final', redis.call('HGET', KEYS[1], 'error') or ''}
    end
  elseif ARGV[2] == 'idem' or state == 'retryable' or ARGV[3] == '1' then
    redis.call('HINCRBY', KEYS[1], 'live', 1)
    redis.call('HSET', KEYS[1], 'state', 'open')
    redis.call('EXPIRE', KEYS[1], ARGV[4])
    return {'joined', redis.call('HGET', KEYS[1], 'op')}
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'op', ARGV[1], 'state', 'open', 'live', 1, 'body', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {'new', ARGV[1]}
"""
# KEYS[1]: the record; ARGV: operation key, outcome (delivered, retryable, dropped, final, refused), error json,
# kind, ttl. A record that holds another operation (replaced meanwhile) is left alone. Returns the live count.
END_SCRIPT = """
if redis.call('HGET', KEYS[1], 'op') ~= ARGV[1] then return -1 end
if ARGV[2] == 'refused' then
  redis.call('DEL', KEYS[1])
  return 0
end
if ARGV[2] == 'final' then
  if ARGV[4] == 'idem' then
    redis.call('HSET', KEYS[1], 'state', 'final', 'error', ARGV[3], 'live', 0)
    redis.call('EXPIRE', KEYS[1], ARGV[5])
  else
    redis.call('DEL', KEYS[1])
  end
  return 0
end
local live = redis.call('HINCRBY', KEYS[1], 'live', -1)
if live <= 0 then
  local state = 'retryable'
  if ARGV[2] == 'delivered' then state = 'delivered' end
  redis.call('HSET', KEYS[1], 'live', 0, 'state', state)
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  return 0
end
return live
"""
# KEYS[1]: the record; ARGV[1]: operation key. The connections waiting on the call now (0 for a record that is
# gone or holds another operation).
LIVE_SCRIPT = """
if redis.call('HGET', KEYS[1], 'op') ~= ARGV[1] then return 0 end
return tonumber(redis.call('HGET', KEYS[1], 'live') or '0')
"""
# KEYS[1]: the record; ARGV: operation key, the state to leave (retryable or delivered; empty deletes the
# record). Nothing changes when a retry joined meanwhile (live above 0) or the record holds another operation.
ABANDON_SCRIPT = """
if redis.call('HGET', KEYS[1], 'op') ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'live') or '0') > 0 then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('HSET', KEYS[1], 'state', ARGV[2]) end
return 1
"""
