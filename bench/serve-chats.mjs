// serve-chats.mjs -- C conversations at once against an OpenAI-compatible
// server, T turns each: every turn sends the whole history (system prompt,
// the user turns, the answers so far) as a streamed chat completion, so a
// server with prefix reuse decodes only each turn's new tokens.  node's http
// module only.  Prints one JSON line: per chat and turn prompt_tokens,
// completion_tokens, ttft_ms and ms; exits 1 if any turn failed (an HTTP
// status other than 200, an error event, no [DONE], no text).
//   node serve-chats.mjs BASE_URL CHATS TURNS MAX_TOKENS [API_KEY]
import http from 'node:http';

const [base, cArg, tArg, nArg, key] = process.argv.slice(2);
const C = +cArg, T = +tArg, N = +nArg, url = new URL(base);
const topics = ['a lighthouse keeper', 'a clockmaker', 'a travelling circus', 'a mountain village'];
const asks = ['Tell me a short story about %s.', 'What happened next?', 'Who else was there?', 'How did it end?',
              'Give the story a title.', 'Retell it in two sentences.'];

function turn(messages) {
    return new Promise((resolve) => {
        const body = JSON.stringify({ messages, max_tokens: N, temperature: 0, stream: true,
                                      stream_options: { include_usage: true } });
        const headers = { 'Content-Type': 'application/json' };
        if (key) headers.Authorization = 'Bearer ' + key;
        const t0 = performance.now();
        let first = null, text = '', usage = null, done = false, error = null, buf = '';
        const req = http.request({ host: url.hostname, port: url.port, path: '/v1/chat/completions', method: 'POST',
                                   headers }, (res) => {
            res.setEncoding('utf8');
            res.on('data', (d) => {
                buf += d;
                let k;
                while ((k = buf.indexOf('\n\n')) >= 0) {
                    const ev = buf.slice(0, k);
                    buf = buf.slice(k + 2);
                    if (ev === 'data: [DONE]') { done = true; continue; }
                    if (!ev.startsWith('data: ')) continue;
                    let j;
                    try { j = JSON.parse(ev.slice(6)); } catch { error = 'bad event: ' + ev.slice(0, 80); continue; }
                    if (j.error) error = j.error.message;
                    if (j.usage) usage = j.usage;
                    const c = j.choices && j.choices[0] && j.choices[0].delta && j.choices[0].delta.content;
                    if (c) { if (first === null) first = performance.now() - t0; text += c; }
                }
            });
            res.on('end', () => resolve({ status: res.statusCode, text, usage, done, error, ttft: first,
                                          ms: performance.now() - t0 }));
            res.on('error', (e) => resolve({ status: res.statusCode, error: e.message }));
        });
        req.on('error', (e) => resolve({ status: 0, error: e.message }));
        req.end(body);
    });
}

let failed = 0;
const chats = await Promise.all(Array.from({ length: C }, async (_, c) => {
    const messages = [{ role: 'system', content: 'You are a storyteller. Answer briefly.' }];
    const turns = [];
    for (let t = 0; t < T; t++) {
        messages.push({ role: 'user', content: asks[t % asks.length].replace('%s', topics[c % topics.length]) });
        const r = await turn(messages);
        const okTurn = r.status === 200 && r.done && !r.error && r.usage;
        if (!okTurn) {
            failed++;
            console.error(`chat ${c} turn ${t}: status ${r.status}${r.error ? ', ' + r.error : ''}${r.done ? '' : ', no [DONE]'}`);
        }
        turns.push({ prompt_tokens: r.usage ? r.usage.prompt_tokens : null,
                     completion_tokens: r.usage ? r.usage.completion_tokens : null,
                     ttft_ms: r.ttft === null || r.ttft === undefined ? null : +r.ttft.toFixed(1), ms: +(r.ms || 0).toFixed(1),
                     ok: !!okTurn });
        if (!okTurn) break;
        messages.push({ role: 'assistant', content: r.text });
    }
    return { chat: c, turns };
}));
console.log(JSON.stringify({ chats: C, turns: T, max_tokens: N, failed, results: chats }));
process.exit(failed ? 1 : 0);
