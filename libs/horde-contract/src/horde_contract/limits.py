"""Limits and defaults of the chat contract, with the spec's names and values.

See docs/native-api.md#request-body, #images, #tools, #refused-keys-and-values, #flattened-prompt,
#chat-job-payload, #job-lease, #progress, #submit, #pricing, #operation-key;
docs/native-api.md#text-route (text params ranges) and #text-route (max_length 16–16384).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

KIB: Final = 1024
MIB: Final = 1024 * 1024

# Request body
MAX_CHAT_BODY_BYTES: Final = 36 * MIB
MAX_CHAT_MODEL_COUNT: Final = 5
MAX_CHAT_MESSAGE_COUNT: Final = 1024
MAX_CHAT_TEXT_BYTES: Final = 1 * MIB
MIN_CHAT_MAX_TOKENS: Final = 16
MAX_CHAT_MAX_TOKENS: Final = 16384
DEFAULT_CHAT_MAX_TOKENS: Final = 512
# OpenAI's stop cap, applied by the front only (the native route keeps the text route's rules).
OPENAI_MAX_STOP_SEQUENCES: Final = 4

# Tools
MAX_CHAT_TOOL_COUNT: Final = 128
MAX_CHAT_TOOL_SPEC_BYTES: Final = 256 * KIB
MAX_CHAT_SCHEMA_NESTING: Final = 10
MAX_CHAT_TOOL_CALL_COUNT: Final = 128
MAX_CHAT_TOOL_CALL_ID_LENGTH: Final = 256
MAX_CHAT_TOOL_NAME_LENGTH: Final = 64
CHAT_TOOL_NAME_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"

# Images
MAX_CHAT_IMAGE_COUNT: Final = 20
MAX_CHAT_IMAGE_BYTES: Final = 5 * MIB
MAX_CHAT_IMAGE_TOTAL_BYTES: Final = 25 * MIB
MAX_CHAT_IMAGE_TOTAL_BYTES_UNTRUSTED: Final = 5 * MIB
MAX_CHAT_IMAGE_PIXELS: Final = 3072 * 3072
CHAT_IMAGE_MAX_SIDE: Final = 2048
CHAT_IMAGE_JPEG_QUALITY: Final = 90
CHAT_IMAGE_PROMPT_TOKENS: Final = 512
CHAT_IMAGE_PLACEHOLDER: Final = "[image]"
CHAT_IMAGE_REFERENCE_SCHEME: Final = "horde-r2://"
EXTRA_SOURCE_IMAGE_HORDE_TAX: Final = 5
MIN_CHAT_IMAGE_URL_SECONDS: Final = 600
# The public image fetch under attack: only the standard web ports, an http(s) URL of at
# most 8 KiB (what common servers accept), 10 s for one URL with its redirects (each connect and read still
# times out after 2 s), 20 s for all of a request's images, fetched and decoded (the front waits 30 s for the
# native answer), and the formats the decoder opens (what OpenAI accepts; a GIF or WebP gives its first frame).
CHAT_IMAGE_FETCH_PORTS: Final = frozenset({80, 443})
MAX_CHAT_IMAGE_URL_LENGTH: Final = 8 * KIB
CHAT_IMAGE_FETCH_DEADLINE_SECONDS: Final = 10.0
CHAT_IMAGE_STAGE_DEADLINE_SECONDS: Final = 20.0
CHAT_IMAGE_FORMATS: Final = ("JPEG", "PNG", "WEBP", "GIF")
CHAT_MESSAGES_URL_SECONDS: Final = 120
CHAT_MESSAGES_OFFLOAD_BYTES_DEFAULT: Final = 256 * KIB

# Prompt estimate: characters per token of the character-based estimate.
CHARS_PER_TOKEN: Final = 4

# Sampling: OpenAI's ranges (the front), and the values a chat job carries when the client sent none.
OPENAI_SAMPLING_RANGES: Final = MappingProxyType(
    {
        "temperature": (0.0, 2.0),
        "top_p": (0.0, 1.0),
        "frequency_penalty": (-2.0, 2.0),
        "presence_penalty": (-2.0, 2.0),
    }
)
CHAT_SAMPLING_DEFAULTS: Final = MappingProxyType(
    {
        "temperature": 1.0,
        "top_p": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "rep_pen": 1.0,
        "top_k": 0,
        "min_p": 0.0,
    }
)
# The native chat penalty range (the text params model does not know the penalties).
CHAT_PENALTY_RANGE: Final = (-2.0, 2.0)

# Text params (upstream ranges; max_length widened to 16–16384 for this project, docs/native-api.md#text-route)
TEXT_MAX_LENGTH_RANGE: Final = (16, 16384)
TEXT_MAX_CONTEXT_LENGTH_RANGE: Final = (80, 1_048_576)
TEXT_DEFAULT_MAX_LENGTH: Final = 80
TEXT_DEFAULT_MAX_CONTEXT_LENGTH: Final = 2048
MAX_TEXT_STOP_SEQUENCES: Final = 128
MAX_TEXT_STOP_SEQUENCE_CHARS: Final = 2000
MIN_SAMPLER_ORDER_VALUES: Final = 7
# Legacy text route bounds. Upstream bounds neither the prompt nor the request's lists; these
# follow its worker-side model bounds (a pop keeps at most 200 models of at most 255 characters) and the chat
# text allowance (a prompt of 1 MiB is about 262,000 tokens, beyond every worker's context). Only the first
# MAX_TEXT_WORKERS_KEPT worker ids of a text request are kept, as upstream; a longer list is refused past
# MAX_TEXT_WORKER_IDS. Unknown params keys pass through to workers, so params are bounded as a whole.
MAX_TEXT_PROMPT_BYTES: Final = MAX_CHAT_TEXT_BYTES
MAX_TEXT_MODEL_COUNT: Final = 200
MAX_MODEL_NAME_LENGTH: Final = 255
MAX_TEXT_WORKERS_KEPT: Final = 5
MAX_TEXT_WORKER_IDS: Final = 100
MAX_TEXT_PARAMS_BYTES: Final = 256 * KIB
# Worker id lists of a request: an id is a UUID (36 characters, 45 as a urn); horde.only and horde.ignore of a
# chat request hold at most the five ids a text request keeps (an entry is never dropped, so more is refused).
MAX_WORKER_ID_LENGTH: Final = 64
MAX_CHAT_WORKER_IDS: Final = MAX_TEXT_WORKERS_KEPT

# Submit and pricing
MAX_CHAT_NATIVE_FINISH_REASON_LENGTH: Final = 32
MAX_CHAT_REPORTED_TOKENS: Final = 10_000_000
MIN_CHARGED_TOKENS: Final = 20
MAX_CHAT_FAULT_REASON_LENGTH: Final = 1000
FAULTED_GENERATIONS_LIMIT: Final = 2
CHAT_CHARGE_BASIS_OUTPUT_ESTIMATE: Final = "output_estimate"

# Job lease and speed gate
TEXT_JOB_LEASE_SECONDS: Final = 150
TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS: Final = 600
UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS: Final = 200
TEXT_JOB_PREPARATION_SECONDS: Final = 30
UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND: Final = 10

# Long-poll pop (a Horde Chat extension): the most seconds a pop's ``wait_seconds`` may ask dispatch to hold an
# empty answer while it waits for a job to be queued.
MAX_POP_WAIT_SECONDS: Final = 20
# The most ``priority_usernames`` a pop may list (each "alias#id", at most 100 characters): a waiting pop keeps
# them, and every retry sends them to PostgreSQL (upstream has no bound; its workers list a handful).
MAX_POP_PRIORITY_USERNAMES: Final = 100

# Streaming progress
CHAT_STREAM_PROGRESS_KEY: Final = "stream_progress"
CHAT_PROGRESS_LEASE_GRACE_SECONDS: Final = 90
MAX_CHAT_PROGRESS_ENTRIES: Final = 1000
CHAT_PROGRESS_BYTES_PER_TOKEN: Final = 16
CHAT_PROGRESS_STREAM_TTL_SECONDS: Final = 900
CHAT_PROGRESS_STREAM_MAX_ENTRIES: Final = 4000

# Request body bounds per route (bounded parsing): bytes, and the JSON structure the body reader
# (horde_core.body) checks before json builds any object. An element is one `[`, `{` or `,` outside strings,
# so a body builds at most about two Python objects per element (a few hundred bytes at most), whatever its
# bytes: `[{},{},…]` would otherwise grow about 25 times its size in memory. Every legal body fits with room.
#: Nesting of arrays and objects, the root being level 1, on every route. The deepest legal chat body is a
#: schema nested MAX_CHAT_SCHEMA_NESTING (10) levels below its root, two JSON levels a schema level
#: (``properties`` → name → subschema), below ``tools[i].function.parameters`` (5 levels): about 25.
MAX_JSON_BODY_DEPTH: Final = 64
#: The chat and text request routes (front and admission; their byte bound is MAX_CHAT_BODY_BYTES). The
#: tool spec (MAX_CHAT_TOOL_SPEC_BYTES of compact JSON, one byte an element at the densest) holds at most
#: 262,144 elements, MAX_CHAT_MESSAGE_COUNT messages at 64 elements each (the message, its content parts,
#: its tool calls, which the tool messages answering them bound) 65,536, the rest (models, stop sequences,
#: horde options) a few thousand: 2**19 leaves room, and bounds a body's objects to about 50 MiB.
MAX_CHAT_BODY_ELEMENTS: Final = 524_288
#: The largest legal reply: reasoning_content up to MAX_CHAT_TEXT_BYTES plus content and tool calls within
#: MAX_CHAT_MAX_TOKENS * CHAT_PROGRESS_BYTES_PER_TOKEN (256 KiB), each UTF-8 byte at most six bytes as a
#: JSON escape (``\u0001``), plus the envelope: 7.5 MiB and change, rounded to 8 MiB.
MAX_SUBMIT_BODY_BYTES: Final = 8 * MIB
#: A submit's structure: up to MAX_CHAT_TOOL_CALL_COUNT calls of a few elements each, gen_metadata entries.
MAX_SUBMIT_BODY_ELEMENTS: Final = 16_384
#: A progress post's delta is at most the generation's byte cap (CHAT_PROGRESS_BYTES_PER_TOKEN per
#: max_length token, 256 KiB at the largest max_length), six bytes a character as JSON escapes at most.
MAX_PROGRESS_BODY_BYTES: Final = 2 * MIB
#: ``{id, seq, delta: {content, reasoning_content}}``.
MAX_PROGRESS_BODY_ELEMENTS: Final = 1024
#: A pop: up to 200 kept models of 3-255 characters, 200 softprompts of up to 100, a bridge agent of up to
#: 1000, priority usernames and the chat declaration: under 80 KiB as UTF-8, under 512 KiB escaped.
MAX_POP_BODY_BYTES: Final = 512 * KIB
#: The pop's lists (models, softprompts, priority_usernames, chat_features, image_transports).
MAX_POP_BODY_ELEMENTS: Final = 16_384

# Lifetimes
CHAT_REQUEST_EXPIRY_SECONDS: Final = 20 * 60
ONLINE_WORKER_SECONDS: Final = 300

# Operation key: horde options left out of the fingerprint.
OPERATION_FINGERPRINT_EXCLUDED_HORDE_KEYS: Final = frozenset(
    {"availability_mode", "dry_run", "include_reasoning", "max_kudos", "operation_key"}
)
