// The official `openai` npm package (v4+) against `tessera serve`. Run by serve_load_test.cpp:
//   NODE_PATH=<prefix>/node_modules node openai_client_test.cjs BASE_URL API_KEY MODEL
// Exits non-zero with a message on the first failed check.
'use strict';
const assert = require('node:assert/strict');
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;

const [baseURL, apiKey, model] = process.argv.slice(2);

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [model]);

  // Greedy completion: the reference continuation of stories260K.
  const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0 });
  assert.equal(c.choices[0].text, ', there was a little girl named Lily. She');
  assert.equal(c.choices[0].finish_reason, 'length');
  assert.deepEqual([c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens], [5, 12, 17]);

  // Streamed completion equals the whole one.
  let streamed = '';
  const cs = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, stream: true });
  for await (const chunk of cs) streamed += chunk.choices[0]?.text ?? '';
  assert.equal(streamed, c.choices[0].text);

  // Chat, whole and streamed (with the usage chunk).
  const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Tell me about a dog.' }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 16, user: 'node' });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.ok(chat.choices[0].message.content.length > 0);
  let text = '';
  let usage = null;
  let role = null;
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 16, user: 'node', stream: true, stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices[0]?.delta;
    if (delta?.role) role = delta.role;
    text += delta?.content ?? '';
  }
  assert.equal(role, 'assistant');
  assert.equal(text, chat.choices[0].message.content);
  assert.deepEqual(usage.completion_tokens, chat.usage.completion_tokens);
  assert.deepEqual(usage.prompt_tokens, chat.usage.prompt_tokens);

  // Errors arrive as the client's typed errors, naming the field.
  await assert.rejects(
    client.completions.create({ model, prompt: 'hi', temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature');
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'model');
  const stranger = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(stranger.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);

  // Tool calling, round trip: tools defined, a call (tool_choice required: a tiny model does not call
  // on its own), the result sent back as a `tool` message, then an answer in text (tool_choice none).
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather', description: 'The weather in a city now.',
      parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'],
                    additionalProperties: false },
    },
  }];
  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const called = await client.chat.completions.create({ model, messages: ask, tools, tool_choice: 'required', max_tokens: 48 });
  assert.equal(called.choices[0].finish_reason, 'tool_calls');
  const callMessage = called.choices[0].message;
  assert.equal(callMessage.content, null);
  assert.equal(callMessage.tool_calls.length, 1);
  const call = callMessage.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.deepEqual(Object.keys(args), ['city']);
  assert.equal(typeof args.city, 'string');
  const answered = await client.chat.completions.create({
    model, tools, tool_choice: 'none', max_tokens: 12,
    messages: [...ask, callMessage, { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ celsius: 21 }) }],
  });
  assert.equal(typeof answered.choices[0].message.content, 'string');
  assert.ok(answered.choices[0].message.content.length > 0);
  assert.notEqual(answered.choices[0].finish_reason, 'tool_calls');

  // The call streamed: one delta with the whole call, then finish_reason tool_calls.
  const callStream = await client.chat.completions.create({
    model, messages: ask, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 48,
    stream: true,
  });
  let streamedArgs = '';
  let streamedName = '';
  let streamFinish = null;
  for await (const chunk of callStream) {
    for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
      assert.equal(tc.index, 0);
      streamedName += tc.function?.name ?? '';
      streamedArgs += tc.function?.arguments ?? '';
    }
    streamFinish = chunk.choices[0]?.finish_reason ?? streamFinish;
  }
  assert.equal(streamFinish, 'tool_calls');
  assert.equal(streamedName, 'get_weather');
  assert.equal(typeof JSON.parse(streamedArgs).city, 'string');

  // Structured output: a JSON Schema response format.
  const personSchema = {
    type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'], additionalProperties: false,
  };
  const person = await client.chat.completions.create({
    model, messages: ask, max_tokens: 48, temperature: 1, seed: 5,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: personSchema } },
  });
  const p = JSON.parse(person.choices[0].message.content);
  assert.deepEqual(Object.keys(p).sort(), ['age', 'name']);
  assert.ok(Number.isInteger(p.age) && p.age >= 0 && p.age <= 120);
  assert.equal(typeof p.name, 'string');
  await assert.rejects(
    client.chat.completions.create({ model, messages: ask, response_format: { type: 'json_schema',
      json_schema: { name: 'x', schema: { type: 'object', not: { type: 'null' } } } } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format.json_schema.schema' && /'not'/.test(e.message));

  console.log('openai client: all checks passed');
}

main().catch((e) => {
  console.error('openai client test failed:', e && e.stack ? e.stack : e);
  process.exit(1);
});
