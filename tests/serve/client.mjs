// client.mjs -- drives `sparrow serve` with the official `openai` npm
// package (tests/test_serve.sh installs it): chat completions streamed and
// not, completions, models, error cases, and four streams at once (every
// first chunk must arrive before any stream ends).  Exits non-zero with a
// message on the first failure.
//   node client.mjs BASE_URL OPENAI_MODULE_DIR
import { createRequire } from 'node:module';
const [base, modDir] = process.argv.slice(2);
const require = createRequire(modDir + '/');
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 30000 });

function check(cond, what) {
    if (!cond) { console.error('FAIL: ' + what); process.exit(1); }
    console.log('ok: ' + what);
}

const messages = [{ role: 'system', content: 'You are a storyteller.' },
                  { role: 'user', content: 'Tell me about a cat.' }];

// models
const models = await client.models.list();
check(models.data.length === 1 && typeof models.data[0].id === 'string', 'models.list gives the one model');
const model = models.data[0].id;

// chat, not streamed (greedy, so the streamed one must say the same)
const chat = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
check(chat.object === 'chat.completion' && chat.choices.length === 1, 'chat completion object');
const text = chat.choices[0].message.content;
check(typeof text === 'string' && chat.choices[0].message.role === 'assistant', 'assistant message');
check(['stop', 'length'].includes(chat.choices[0].finish_reason), 'finish_reason ' + chat.choices[0].finish_reason);
check(chat.usage.completion_tokens >= 1 && chat.usage.completion_tokens <= 16 &&
      chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, 'usage adds up');

// chat, streamed, with usage
const stream = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, stream: true,
                                                      stream_options: { include_usage: true } });
let streamed = '', finish = null, usage = null, n_chunks = 0;
for await (const chunk of stream) {
    n_chunks++;
    check(chunk.object === 'chat.completion.chunk', 'chunk ' + n_chunks + ' object');
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length) {
        streamed += chunk.choices[0].delta.content ?? '';
        if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
}
check(streamed === text, 'streamed text equals the whole answer: ' + JSON.stringify(streamed));
check(finish === chat.choices[0].finish_reason, 'streamed finish_reason ' + finish);
check(usage && usage.completion_tokens === chat.usage.completion_tokens, 'usage chunk at the end');

// completions, and the same prompt again (the slot's cached prefix) gives the same text
const comp = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0 });
check(comp.object === 'text_completion' && typeof comp.choices[0].text === 'string', 'completion object');
const comp2 = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0 });
check(comp2.choices[0].text === comp.choices[0].text, 'a repeated prompt gives the same text');
check(comp.usage.prompt_tokens >= 2, 'completion usage');

// a stop string: the text ends before it
if (comp.choices[0].text.length > 4) {
    const stop = comp.choices[0].text.slice(2, 4);
    const cs = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0,
                                                 stop: [stop] });
    const want = comp.choices[0].text.slice(0, comp.choices[0].text.indexOf(stop));
    check(cs.choices[0].text === want && cs.choices[0].finish_reason === 'stop',
          'stop string ' + JSON.stringify(stop) + ' honoured');
}

// errors come back as the library's APIError with the status
for (const [what, body, status] of [
    ['n = 2', { model, messages, n: 2 }, 400],
    ['messages missing', { model }, 400],
    ['temperature a string', { model, messages, temperature: 'hot' }, 400],
]) {
    try {
        await client.chat.completions.create(body);
        check(false, what + ' refused');
    } catch (e) {
        check(e instanceof OpenAI.APIError && e.status === status && e.error && e.error.type === 'invalid_request_error',
              what + ' refused with ' + status + ' (' + (e.message || e) + ')');
    }
}

// four streams at once: every first chunk before any end (200 tokens: 48
// took ~10 ms on the tiny model, less than the client took to start them)
const t0 = Date.now();
const firsts = [], dones = [];
await Promise.all([0, 1, 2, 3].map(async (i) => {
    const s = await client.chat.completions.create({ model, max_tokens: 200, ignore_eos: true, temperature: 0.8,
        messages: [{ role: 'user', content: 'Story number ' + i }], stream: true });
    let first = true;
    for await (const chunk of s) {
        if (first && chunk.choices.length && chunk.choices[0].delta.content) { firsts[i] = Date.now() - t0; first = false; }
    }
    dones[i] = Date.now() - t0;
}));
check(firsts.filter((x) => x !== undefined).length === 4 && Math.max(...firsts) <= Math.min(...dones),
      'four concurrent streams: first chunks ' + firsts + ' ms, ends ' + dones + ' ms');
console.log('client: all passed');
