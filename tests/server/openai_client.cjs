// Drives h2o-server with the official OpenAI client for Node (the `openai` npm package), as a chat
// front-end would: models, a reply, a streamed reply, a continued conversation, an error.
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

try {
  await client.chat.completions.create({ model: 'no-such-model', messages });
  fail('an unknown model was accepted');
} catch (error) {
  if (!(error instanceof OpenAI.APIError) || error.status !== 404) fail(`error: ${error}`);
  console.log(`error: ${error.status} ${error.message}`);
}
}

main().catch((error) => fail(`unexpected: ${error.stack || error}`));
