// The OpenAI Node SDK (npm "openai") against the horde's OpenAI-compatible front: plain, streamed, tool and
// structured (zod) chat completions. Pointing it at the horde is baseURL + apiKey, nothing else.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import OpenAI from "openai";
import { zodFunction, zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { API_KEY, FRONT_URL, GREETING, MODEL, pace } from "./horde.mjs";

const client = new OpenAI({ baseURL: FRONT_URL, apiKey: API_KEY });

beforeEach(pace);

test("chat.completions.create returns the worker's reply", async () => {
  const reply = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "Hello, horde!" }],
  });
  assert.equal(reply.object, "chat.completion");
  assert.equal(reply.model, MODEL);
  assert.equal(reply.choices.length, 1);
  assert.equal(reply.choices[0].message.role, "assistant");
  assert.equal(reply.choices[0].message.content, `${GREETING} Hello, horde!`);
  assert.equal(reply.choices[0].finish_reason, "stop");
  assert.ok(reply.usage.completion_tokens > 0);
  assert.equal(reply.usage.total_tokens, reply.usage.prompt_tokens + reply.usage.completion_tokens);
});

test("a streamed completion arrives in several chunks that concatenate to the reply", async () => {
  const stream = await client.chat.completions.create({
    model: MODEL,
    // [[pace:3]]: the scripted worker spreads its reply over 3 s and posts progress about once a second, so the
    // front relays it as it is written (a reply that is done at once is sent whole, in one chunk).
    messages: [{ role: "user", content: "stream these words please [[pace:3]] [[words:30]]" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  const pieces = [];
  const finishes = [];
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    for (const choice of chunk.choices) {
      if (choice.delta?.content) pieces.push(choice.delta.content);
      if (choice.finish_reason) finishes.push(choice.finish_reason);
    }
    if (chunk.usage) usage = chunk.usage;
  }
  const filler =
    "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november oscar papa " +
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu alpha bravo charlie delta";
  assert.ok(pieces.length > 3, `only ${pieces.length} content chunks: ${JSON.stringify(pieces)}`);
  assert.equal(pieces.join(""), `${GREETING} stream these words please ${filler}`);
  assert.deepEqual(finishes, ["stop"]);
  assert.ok(usage && usage.completion_tokens > 0, `no usage chunk: ${JSON.stringify(usage)}`);
});

test("the stream helper (chat.completions.stream) assembles the final message", async () => {
  const runner = client.chat.completions.stream({
    model: MODEL,
    messages: [{ role: "user", content: "assemble me [[pace:2]] [[words:10]]" }],
  });
  const deltas = [];
  runner.on("content.delta", ({ delta }) => deltas.push(delta));
  const final = await runner.finalChatCompletion();
  const expected = `${GREETING} assemble me alpha bravo charlie delta echo foxtrot golf hotel india juliett`;
  assert.equal(final.choices[0].message.content, expected);
  assert.equal(final.choices[0].finish_reason, "stop");
  assert.equal(deltas.join(""), expected);
  assert.ok(deltas.length > 1, JSON.stringify(deltas));
});

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city.",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
};

test("tools: the worker's tool call comes back as parsed tool_calls", async () => {
  const reply = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "What is the weather in Paris? [[tool:get_weather]]" }],
    tools: [weatherTool],
    tool_choice: "auto",
  });
  const choice = reply.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.equal(call.id, "call_1");
  assert.equal(call.function.name, "get_weather");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "scripted", unit: "celsius" });
});

test("tools: the tool result goes back in the conversation and the model answers", async () => {
  const reply = await client.chat.completions.create({
    model: MODEL,
    messages: [
      { role: "user", content: "Weather in Paris?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [
          { id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } },
        ],
      },
      { role: "tool", tool_call_id: "call_1", content: '{"temperature": 21}' },
      { role: "user", content: "Thanks, summarise." },
    ],
    tools: [weatherTool],
  });
  assert.equal(reply.choices[0].finish_reason, "stop");
  assert.equal(reply.choices[0].message.content, `${GREETING} Thanks, summarise.`);
});

const Person = z.object({
  name: z.string(),
  age: z.number().int().min(18).max(120),
  role: z.enum(["admin", "user"]),
  tags: z.array(z.string()).min(2),
  active: z.boolean(),
});

test("chat.completions.parse with zodResponseFormat returns the parsed object", async () => {
  const reply = await client.chat.completions.parse({
    model: MODEL,
    messages: [{ role: "user", content: "Describe a person." }],
    response_format: zodResponseFormat(Person, "person"),
  });
  const message = reply.choices[0].message;
  assert.equal(message.refusal ?? null, null); // the front omits "refusal" when there is none
  assert.deepEqual(message.parsed, {
    name: "scripted",
    age: 18,
    role: "admin",
    tags: ["scripted", "scripted"],
    active: true,
  });
  assert.deepEqual(Person.parse(JSON.parse(message.content)), message.parsed);
});

test("chat.completions.parse with a zodFunction tool returns parsed_arguments", async () => {
  const reply = await client.chat.completions.parse({
    model: MODEL,
    messages: [{ role: "user", content: "Look up a person [[tool]]" }],
    tools: [zodFunction({ name: "lookup_person", parameters: Person })],
  });
  const call = reply.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, "lookup_person");
  assert.deepEqual(call.function.parsed_arguments, {
    name: "scripted",
    age: 18,
    role: "admin",
    tags: ["scripted", "scripted"],
    active: true,
  });
});

test("models.list lists the worker's model", async () => {
  const ids = [];
  for await (const model of client.models.list()) ids.push(model.id);
  assert.ok(ids.includes(MODEL), JSON.stringify(ids));
});

test("an unknown model is a NotFoundError the SDK raises", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "no/such-model", messages: [{ role: "user", content: "hi" }] }),
    (err) => err instanceof OpenAI.NotFoundError && err.status === 404,
  );
});
