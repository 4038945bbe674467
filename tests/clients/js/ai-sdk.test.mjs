// The Vercel AI SDK (npm "ai") against the horde's OpenAI-compatible front, through its two providers:
// @ai-sdk/openai-compatible (createOpenAICompatible: the Chat Completions API, the one the horde serves) and
// @ai-sdk/openai, whose default call goes to the Responses API (/v1/responses, not served by the horde): use
// its .chat(model) there.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { APICallError, generateText, Output, streamText, tool } from "ai";
import { z } from "zod";
import { API_KEY, FRONT_URL, GREETING, MODEL, pace } from "./horde.mjs";

const horde = createOpenAICompatible({
  name: "horde",
  baseURL: FRONT_URL,
  apiKey: API_KEY,
  includeUsage: true, // usage on streamed replies (stream_options.include_usage)
  supportsStructuredOutputs: true, // response_format json_schema for Output.object
});
const openai = createOpenAI({ baseURL: FRONT_URL, apiKey: API_KEY });

beforeEach(pace);

test("openai-compatible: generateText", async () => {
  const result = await generateText({ model: horde(MODEL), prompt: "Hello from the AI SDK", maxRetries: 0 });
  assert.equal(result.text, `${GREETING} Hello from the AI SDK`);
  assert.equal(result.finishReason, "stop");
  assert.ok(result.usage.outputTokens > 0);
  assert.equal(result.usage.totalTokens, result.usage.inputTokens + result.usage.outputTokens);
  assert.equal(result.response.modelId, MODEL);
});

test("openai-compatible: generateText with a system prompt and a conversation", async () => {
  const result = await generateText({
    model: horde(MODEL),
    system: "You are terse.",
    messages: [
      { role: "user", content: "First question" },
      { role: "assistant", content: "First answer" },
      { role: "user", content: "Second question" },
    ],
    maxRetries: 0,
  });
  assert.equal(result.text, `${GREETING} Second question`);
});

test("openai-compatible: streamText relays the reply in several parts", async () => {
  // [[pace:3]]: the scripted worker writes for 3 s and posts progress about once a second, so the front
  // relays the reply as it is written.
  const errors = [];
  const result = streamText({
    model: horde(MODEL),
    prompt: "stream it [[pace:3]] [[words:20]]",
    maxRetries: 0,
    onError: ({ error }) => errors.push(error),
  });
  const parts = [];
  for await (const part of result.textStream) parts.push(part);
  const expected =
    `${GREETING} stream it alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike ` +
    "november oscar papa quebec romeo sierra tango";
  assert.deepEqual(errors, []);
  assert.ok(parts.length > 3, `only ${parts.length} text parts: ${JSON.stringify(parts)}`);
  assert.equal(parts.join(""), expected);
  assert.equal(await result.text, expected);
  assert.equal(await result.finishReason, "stop");
  assert.ok((await result.usage).outputTokens > 0);
});

test("openai-compatible: a tool call is parsed and executed", async () => {
  const executed = [];
  const result = await generateText({
    model: horde(MODEL),
    prompt: "What is the weather in Paris? [[tool:get_weather]]",
    tools: {
      get_weather: tool({
        description: "The weather in a city.",
        inputSchema: z.object({ city: z.string(), unit: z.enum(["celsius", "fahrenheit"]) }),
        execute: async (input) => {
          executed.push(input);
          return { temperature: 21 };
        },
      }),
    },
    maxRetries: 0,
  });
  assert.equal(result.finishReason, "tool-calls");
  assert.equal(result.toolCalls.length, 1);
  assert.equal(result.toolCalls[0].toolName, "get_weather");
  assert.equal(result.toolCalls[0].toolCallId, "call_1");
  assert.deepEqual(result.toolCalls[0].input, { city: "scripted", unit: "celsius" });
  assert.deepEqual(executed, [{ city: "scripted", unit: "celsius" }]);
  assert.deepEqual(result.toolResults[0].output, { temperature: 21 });
});

test("openai-compatible: structured output (Output.object with a zod schema)", async () => {
  const result = await generateText({
    model: horde(MODEL),
    prompt: "Describe a city.",
    output: Output.object({
      schema: z.object({ city: z.string(), population: z.number().int().min(1000), capital: z.boolean() }),
    }),
    maxRetries: 0,
  });
  assert.deepEqual(result.output, { city: "scripted", population: 1000, capital: true });
});

test("@ai-sdk/openai: createOpenAI(...).chat(model) with generateText", async () => {
  const result = await generateText({ model: openai.chat(MODEL), prompt: "Hello via .chat", maxRetries: 0 });
  assert.equal(result.text, `${GREETING} Hello via .chat`);
  assert.equal(result.finishReason, "stop");
  assert.ok(result.usage.outputTokens > 0);
});

test("@ai-sdk/openai: the default createOpenAI(...)(model) calls /v1/responses, which the horde does not serve", async () => {
  await assert.rejects(
    generateText({ model: openai(MODEL), prompt: "Hello via responses", maxRetries: 0 }),
    (err) => APICallError.isInstance(err) && err.statusCode === 404 && err.url === `${FRONT_URL}/responses`,
  );
});
