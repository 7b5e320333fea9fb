// Drives h2o-server with the official OpenAI client for Node (the `openai` npm package), as a chat
// front-end would: models, a reply, a streamed reply, a continued conversation, a reply held to a
// JSON schema, a tool call and its result (plain and streamed), errors. (The server answers to two names here, so that another is an error.)
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

  // A tool-calling round trip: a required call, its result sent back, the answer; streamed too.
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather', description: 'The weather in a city',
      parameters: { type: 'object', additionalProperties: false, required: ['city'], properties: { city: { enum: ['Paris', 'Rome'] } } },
    },
  }];
  const talk = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const called = await client.chat.completions.create({ model, messages: talk, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 400, temperature: 0 });
  const calls = called.choices[0].message.tool_calls;
  if (called.choices[0].finish_reason !== 'tool_calls' || !calls?.length || calls[0].function.name !== 'get_weather' ||
      !['Paris', 'Rome'].includes(JSON.parse(calls[0].function.arguments).city)) {
    fail(`tool call: ${JSON.stringify(called.choices[0])}`);
  }
  console.log(`tool call: ${calls[0].function.name}(${calls[0].function.arguments}) id ${calls[0].id}`);
  const callStream = await client.chat.completions.create({
    model, messages: talk, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 400, temperature: 0, stream: true,
  });
  const streamedCalls = [];
  let callFinish = null;
  for await (const chunk of callStream) {
    if (!chunk.choices.length) continue;
    for (const delta of chunk.choices[0].delta.tool_calls ?? []) {
      if (!streamedCalls[delta.index]) streamedCalls[delta.index] = { id: delta.id, name: '', arguments: '' };
      streamedCalls[delta.index].name += delta.function?.name ?? '';
      streamedCalls[delta.index].arguments += delta.function?.arguments ?? '';
    }
    callFinish = chunk.choices[0].finish_reason ?? callFinish;
  }
  if (callFinish !== 'tool_calls' || streamedCalls.length !== calls.length || streamedCalls[0].name !== calls[0].function.name ||
      streamedCalls[0].arguments !== calls[0].function.arguments) {
    fail(`streamed tool call: ${JSON.stringify(streamedCalls)} (${callFinish})`);
  }
  console.log(`streamed tool call: the same ${streamedCalls.length} call(s), finish_reason ${callFinish}`);
  talk.push(called.choices[0].message);
  for (const call of calls) talk.push({ role: 'tool', tool_call_id: call.id, content: '{"sky": "clear", "celsius": 21}' });
  const answer = await client.chat.completions.create({ model, messages: talk, tools, max_tokens: 12, temperature: 0, tool_choice: 'none' });
  if (typeof answer.choices[0].message.content !== 'string' || !(answer.usage.prompt_tokens_details.cached_tokens > 0)) {
    fail(`answer after the tool: ${JSON.stringify(answer)}`);
  }
  console.log(`answer after the tool: ${JSON.stringify(answer.choices[0].message.content)}, ` +
              `${answer.usage.prompt_tokens_details.cached_tokens} prompt tokens held`);

  try {
    await client.chat.completions.create({ model: 'no-such-model', messages });
    fail('an unknown model was accepted');
  } catch (error) {
    if (!(error instanceof OpenAI.APIError) || error.status !== 404) fail(`error: ${error}`);
    console.log(`error: ${error.status} ${error.message}`);
  }
}

main().catch((error) => fail(`unexpected: ${error.stack || error}`));
