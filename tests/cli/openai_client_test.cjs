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
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.param === 'model');
  const stranger = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(stranger.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);

  console.log('openai client: all checks passed');
}

main().catch((e) => {
  console.error('openai client test failed:', e && e.stack ? e.stack : e);
  process.exit(1);
});
