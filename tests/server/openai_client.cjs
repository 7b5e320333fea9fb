// Drives h2o-server with the official OpenAI client for Node (the `openai` npm package), as a chat
// front-end would: models, a reply, a streamed reply, a continued conversation, a reply held to a
// JSON schema, errors. (The server answers to two names here, so that another is an error.)
const OpenAI = require('openai');

const client = new OpenAI({ baseURL: process.env.H2O_SERVER_URL, apiKey: 'not-needed' });
const fail = (message) => { console.error(message); process.exit(1); };

async function main() {
  const models = await client.models.list();
  const model = models.data[0].id;
  if (model !== 'stories260K') fail(`models: ${JSON.stringify(models.data)}`);

  const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Once upon a time' }];
  const reply = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  const text = reply.choices[0].message.content;
  if (typeof text !== 'string' || reply.usage.completion_tokens < 1) fail(`reply: ${JSON.stringify(reply)}`);
  console.log(`reply: ${JSON.stringify(text)}`);

  const stream = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stream: true });
  let streamed = '';
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      streamed += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
}
if (streamed !== text || finish === null) fail(`stream: ${JSON.stringify(streamed)} (${finish}) != ${JSON.stringify(text)}`);
console.log(`stream: the same text, finish_reason ${finish}`);

messages.push({ role: 'assistant', content: text }, { role: 'user', content: 'And then?' });
const next = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
if (!(next.usage.prompt_tokens_details.cached_tokens > 0)) fail(`continued: ${JSON.stringify(next.usage)}`);
console.log(`continued: ${next.usage.prompt_tokens_details.cached_tokens} of ${next.usage.prompt_tokens} prompt tokens held`);

const pet = {
  type: 'object', additionalProperties: false, required: ['age', 'pet'],
  properties: { age: { type: 'integer' }, pet: { enum: ['cat', 'dog'] } },
};
const structured = await client.chat.completions.create({
  model, messages, max_tokens: 200, temperature: 0,
  response_format: { type: 'json_schema', json_schema: { name: 'pet', strict: true, schema: pet } },
});
const value = JSON.parse(structured.choices[0].message.content);
if (!Number.isInteger(value.age) || !['cat', 'dog'].includes(value.pet) || Object.keys(value).length !== 2) {
  fail(`structured: ${JSON.stringify(structured.choices[0])}`);
}
console.log(`structured: ${JSON.stringify(value)}`);

try {
  await client.chat.completions.create({
    model, messages, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { type: 'string', pattern: 'a+' } } },
  });
  fail('a schema with a pattern was accepted');
} catch (error) {
  if (!(error instanceof OpenAI.BadRequestError)) fail(`pattern: ${error}`);
  console.log(`refused schema: ${error.status} ${error.message}`);
}

try {
  await client.chat.completions.create({ model: 'no-such-model', messages });
  fail('an unknown model was accepted');
} catch (error) {
  if (!(error instanceof OpenAI.APIError) || error.status !== 404) fail(`error: ${error}`);
  console.log(`error: ${error.status} ${error.message}`);
}
}

main().catch((error) => fail(`unexpected: ${error.stack || error}`));
